//! The Lease protocol's one write path: compare-and-swap on `metadata.resourceVersion`.
//!
//! The operator (assigning holders, requesting handovers, its own HA lease) and candidates
//! (renewing, releasing) write Leases only through [`LeaseStore`], so every write is either a
//! create that fails if the Lease exists, or a replace that fails if anyone wrote since the
//! version read. Nobody force-applies a Lease.
//!
//! `strategy` and `preferredHolder` are upstream fields that the API server drops unless the
//! CoordinatedLeaderElection gate is on, so they are also written as annotations, and read from
//! either.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use crate::tolerant::Tolerant;
use crate::{FIELD_MANAGER, written_by_arbiter};

/// Label on every Lease the arbiter manages (the operator watches only these).
pub const MANAGED_LABEL: &str = "arbiter.dev/managed";
pub const STRATEGY_ANNOTATION: &str = "arbiter.dev/strategy";
pub const PREFERRED_HOLDER_ANNOTATION: &str = "arbiter.dev/preferred-holder";
/// On a Lease: the uid of the pod its holder runs in (written by the arbiter with each
/// assignment, so that the holder's confirmed death is recognised even after its candidate is
/// gone).
pub const HOLDER_POD_ANNOTATION: &str = "arbiter.dev/holder-pod-uid";
/// On a Lease: `INCARNATION:UID`, the pod whose agent took the current term (written by the agent
/// with its incarnation, which it names, so that a value left from an earlier process proves
/// nothing; absent when the agent runs outside a pod). The recorded pod's stop ends the term
/// only if the term was taken in it.
pub const TAKEN_IN_POD_ANNOTATION: &str = "arbiter.dev/taken-in-pod";

/// The value of [`TAKEN_IN_POD_ANNOTATION`] for process `incarnation` in pod `uid` (read back by
/// [`taken_in_pod`]).
pub fn taken_in(incarnation: &str, uid: &str) -> String {
    format!("{incarnation}:{uid}")
}
/// On a Lease: the holder pod's container restart count when the arbiter assigned it (a forced
/// exit is due only if the deposed pod still runs with that count).
pub const RESTARTS_ANNOTATION: &str = "arbiter.dev/holder-restarts";
/// On a Lease: the forced exits still pending: `candidate/pod/uid/restarts`, comma-separated.
pub const PENDING_ANNOTATION: &str = "arbiter.dev/pending-forced-exits";
/// The holding agent's process incarnation (defined with the candidates' marks: agents stamp
/// it on both).
pub use crate::INCARNATION_ANNOTATION;
/// On a Lease: `HOLDER/TERM`, written by the arbiter with every assignment ([`assignment`]).
/// An agent takes a term only from a Lease carrying it for its own identity and the Lease's
/// term (and arbiter's label): a Lease arbiter did not assign (a client-go Lease kept under
/// `arbiter run`, one made by hand) names its holder for someone else's reasons.
pub const ASSIGNED_ANNOTATION: &str = "arbiter.dev/assigned";

/// The value of [`ASSIGNED_ANNOTATION`] for `holder` at `term`.
pub fn assignment(holder: &str, term: i32) -> String {
    format!("{holder}/{term}")
}

/// Whether the arbiter assigned `lease`'s current term to its holder: it carries arbiter's
/// label and the assignment mark for its holder and term.
pub fn assigned_by_arbiter(lease: &Lease) -> bool {
    managed(lease) && assigned_by_arbiter_unlabelled(lease)
}

/// Whether `lease` carries the assignment mark for its current holder and term (label or not).
pub fn assigned_by_arbiter_unlabelled(lease: &Lease) -> bool {
    let Some(holder) = holder(lease) else {
        return false;
    };
    lease
        .annotations()
        .get(ASSIGNED_ANNOTATION)
        .map(String::as_str)
        == Some(assignment(holder, term(lease)).as_str())
}

/// The install `lease` belongs to ([`crate::INSTANCE_LABEL`]; `None`: an install without
/// `--instance`). An empty label is an instance no install has, as the API server's selectors
/// see it.
pub fn instance(lease: &Lease) -> Option<&str> {
    lease
        .labels()
        .get(crate::INSTANCE_LABEL)
        .map(String::as_str)
}

/// Labels `lease` as arbiter's, of install `instance` (an install without one removes the
/// label: what it writes is its own).
pub fn label(lease: &mut Lease, instance: Option<&str>) {
    let labels = lease.labels_mut();
    labels.insert(MANAGED_LABEL.into(), "true".into());
    match instance {
        Some(i) => labels.insert(crate::INSTANCE_LABEL.into(), i.into()),
        None => labels.remove(crate::INSTANCE_LABEL),
    };
}

/// Whether `lease` carries arbiter's label ([`MANAGED_LABEL`]).
pub fn managed(lease: &Lease) -> bool {
    lease
        .labels()
        .get(MANAGED_LABEL)
        .is_some_and(|v| v == "true")
}

/// What a candidate process writes to its container's termination log when it starts (see
/// `arbiter_candidate::Candidate::termination_log`). When the container ends, the kubelet
/// copies the file into the pod's status (`state.terminated.message`, then
/// `lastState.terminated.message` once it restarts): proof, tied to this very process, that it
/// and everything in its container are gone.
pub fn termination_message(incarnation: &str) -> String {
    format!("arbiter incarnation {incarnation}")
}
/// Who last released the lease (set with `holderIdentity: ""`, cleared on assignment).
pub const RELEASED_BY_ANNOTATION: &str = "arbiter.dev/released-by";
/// On a Lease: a planned switchover asked for by `arbiter handover` (the target candidate, or
/// empty for the best other one). The operator acts on it and removes it.
pub const HANDOVER_REQUEST_ANNOTATION: &str = "arbiter.dev/handover-request";
/// The value of [`HANDOVER_REQUEST_ANNOTATION`]: `HOLDER/TERM/TARGET` (TARGET empty: the best
/// other candidate). A request names the holder and term it was made for: once the lease has
/// moved on it is refused, never carried out on a holder nobody named.
pub fn handover_request(holder: &str, term: i32, to: Option<&str>) -> String {
    format!("{holder}/{term}/{}", to.unwrap_or(""))
}

/// Reads [`handover_request`]'s format; anything else is a request for nobody (refused).
pub fn parse_handover_request(value: &str) -> arbiter_election::decide::Switchover {
    let mut parts = value.splitn(3, '/');
    let (holder, term, to) = (parts.next(), parts.next(), parts.next());
    arbiter_election::decide::Switchover {
        holder: holder.unwrap_or_default().to_string(),
        term: term.and_then(|t| t.parse().ok()).unwrap_or(-1),
        to: to.filter(|t| !t.is_empty()).map(str::to_string),
    }
}

/// On a Lease: why the operator refused the last planned switchover.
pub const HANDOVER_REFUSED_ANNOTATION: &str = "arbiter.dev/handover-refused";

/// A write that lost the compare-and-swap, or failed.
#[derive(Debug, thiserror::Error)]
pub enum CasError {
    /// Someone else wrote first (409), or the Lease already exists on create.
    #[error("lease {0} changed since it was read")]
    Conflict(String),
    #[error("lease {0} not found")]
    NotFound(String),
    #[error("writing lease {name}: {source}")]
    Api {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Lease reads and compare-and-swap writes in one namespace. (Answers are decoded as
/// [`crate::tolerant::Tolerant`]: a Lease with a timestamp past the time type's range is read,
/// not an error.)
#[derive(Clone)]
pub struct LeaseStore {
    api: Api<Tolerant<Lease>>,
}

impl LeaseStore {
    pub fn new(client: Client, namespace: &str) -> LeaseStore {
        LeaseStore {
            api: Api::namespaced(client, namespace),
        }
    }

    pub async fn get(&self, name: &str) -> Result<Option<Lease>, kube::Error> {
        Ok(self.api.get_opt(name).await?.map(|l| l.0))
    }

    /// Creates `lease`; fails with [`CasError::Conflict`] if it already exists.
    pub async fn create(&self, lease: &Lease) -> Result<Lease, CasError> {
        let name = lease.name_any();
        self.api
            .create(&params(), &Tolerant(lease.clone()))
            .await
            .map(|l| l.0)
            .map_err(|e| classify(name, e))
    }

    /// Replaces `lease`, which must carry the resourceVersion it was read at.
    ///
    /// Its managed fields are not sent: the API server then keeps the live object's (a cached
    /// copy may hold them pruned, and sent back they would replace the real ones).
    pub async fn replace(&self, lease: &Lease) -> Result<Lease, CasError> {
        let name = lease.name_any();
        assert!(
            lease.resource_version().is_some(),
            "a Lease replace without resourceVersion is not a CAS"
        );
        let mut lease = lease.clone();
        lease.metadata.managed_fields = None;
        self.api
            .replace(&name, &params(), &Tolerant(lease))
            .await
            .map(|l| l.0)
            .map_err(|e| classify(name, e))
    }
}

fn params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    }
}

fn classify(name: String, e: kube::Error) -> CasError {
    match &e {
        kube::Error::Api(s) if s.code == 409 => CasError::Conflict(name),
        kube::Error::Api(s) if s.code == 404 => CasError::NotFound(name),
        _ => CasError::Api { name, source: e },
    }
}

/// The current holder; `None` when unset or released (`""`).
pub fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}

/// The preferred holder, from the field or the annotation.
pub fn preferred_holder(lease: &Lease) -> Option<&str> {
    let field = lease
        .spec
        .as_ref()
        .and_then(|s| s.preferred_holder.as_deref());
    field
        .or_else(|| {
            lease
                .annotations()
                .get(PREFERRED_HOLDER_ANNOTATION)
                .map(String::as_str)
        })
        .filter(|h| !h.is_empty())
}

/// The strategy, from the field or the annotation.
pub fn strategy(lease: &Lease) -> Option<&str> {
    let field = lease.spec.as_ref().and_then(|s| s.strategy.as_deref());
    field
        .or_else(|| {
            lease
                .annotations()
                .get(STRATEGY_ANNOTATION)
                .map(String::as_str)
        })
        .filter(|s| !s.is_empty())
}

/// The term (fencing token): `leaseTransitions`.
pub fn term(lease: &Lease) -> i32 {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
}

pub fn duration(lease: &Lease) -> Option<Duration> {
    let secs = lease.spec.as_ref()?.lease_duration_seconds?;
    Some(Duration::from_secs(secs.max(0) as u64))
}

pub fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// A renewal's `renewTime`: now, or a microsecond after `previous` when the wall clock does
/// not read later than it (a clock that stands still, or was set back). The arbiter counts a
/// renewal by the record changing, and the API server does not even write an update that
/// changes nothing: a renewal that wrote the same `renewTime` again would look like silence,
/// and its holder be deposed while it runs.
pub fn renewed_after(previous: Option<&MicroTime>) -> MicroTime {
    let now = jiff::Timestamp::now();
    match previous {
        Some(p) if p.0 >= now => MicroTime(
            p.0.checked_add(jiff::SignedDuration::from_micros(1))
                .unwrap_or(p.0),
        ),
        _ => MicroTime(now),
    }
}

/// Who released the lease, if it has no holder and the release was written by arbiter (an
/// agent, or the operator on a pod's behalf): the annotation's field manager must be
/// [`FIELD_MANAGER`], so a hand edit that sets it (`kubectl edit`, `kubectl patch`) does not
/// pass for a holder's own release. Without managed fields (an API server that does not keep
/// them) nothing counts as a release: the arbiter then waits for expiry.
pub fn released_by(lease: &Lease) -> Option<&str> {
    if holder(lease).is_some() {
        return None;
    }
    let by = lease
        .annotations()
        .get(RELEASED_BY_ANNOTATION)
        .map(String::as_str)
        .filter(|b| !b.is_empty())?;
    written_by_arbiter(&lease.metadata, RELEASED_BY_ANNOTATION).then_some(by)
}

/// The incarnation of the agent that took the Lease's current term, only as an agent wrote it
/// (arbiter's field manager), not a hand edit.
pub fn agent_incarnation(lease: &Lease) -> Option<&str> {
    lease
        .annotations()
        .get(INCARNATION_ANNOTATION)
        .map(String::as_str)
        .filter(|i| !i.is_empty() && written_by_arbiter(&lease.metadata, INCARNATION_ANNOTATION))
}

/// The pod the agent that took the Lease's current term runs in, only as an agent wrote it
/// (arbiter's field manager) and for the incarnation on the Lease ([`agent_incarnation`]).
pub fn taken_in_pod(lease: &Lease) -> Option<&str> {
    let incarnation = agent_incarnation(lease)?;
    let value = lease.annotations().get(TAKEN_IN_POD_ANNOTATION)?;
    let (by, uid) = value.split_once(':')?;
    (by == incarnation
        && !uid.is_empty()
        && written_by_arbiter(&lease.metadata, TAKEN_IN_POD_ANNOTATION))
    .then_some(uid)
}

/// Whether any incarnation is stamped on the Lease, whoever wrote it: the operator never acts
/// as the agent of a term that may be an agent's.
pub fn incarnation_stamped(lease: &Lease) -> bool {
    lease
        .annotations()
        .get(INCARNATION_ANNOTATION)
        .is_some_and(|i| !i.is_empty())
}

/// `leaseDurationSeconds` for a duration checked by `arbiter_candidate::flags::lease_duration` (whole
/// seconds).
pub fn seconds(d: Duration) -> i32 {
    debug_assert_eq!(d.subsec_nanos(), 0, "lease durations are whole seconds");
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

/// Marks the lease released (holder `""`, fresh renew time), recording who stepped down.
pub fn mark_released(lease: &mut Lease, by: Option<&str>) {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(String::new());
    spec.renew_time = Some(now());
    if let Some(by) = by {
        set_annotation(lease, RELEASED_BY_ANNOTATION, Some(by));
    }
}

/// Sets or clears the preferred holder, in the field and the annotation.
pub fn set_preferred_holder(lease: &mut Lease, preferred: Option<&str>) {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.preferred_holder = preferred.map(str::to_string);
    set_annotation(lease, PREFERRED_HOLDER_ANNOTATION, preferred);
}

/// Sets the strategy in the field and the annotation.
pub fn set_strategy(lease: &mut Lease, strategy: &str) {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.strategy = Some(strategy.to_string());
    set_annotation(lease, STRATEGY_ANNOTATION, Some(strategy));
}

pub fn set_annotation(lease: &mut Lease, key: &str, value: Option<&str>) {
    let annotations: &mut BTreeMap<String, String> = lease.annotations_mut();
    match value {
        Some(v) => annotations.insert(key.to_string(), v.to_string()),
        None => annotations.remove(key),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_always_changes_renew_time_whatever_the_wall_clock_reads() {
        let ahead = MicroTime(jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1));
        let later = renewed_after(Some(&ahead));
        assert_eq!(
            later.0.duration_since(ahead.0),
            jiff::SignedDuration::from_micros(1),
            "a clock that stands still or was set back: a microsecond after the last"
        );
        let past = MicroTime(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(5));
        let now = renewed_after(Some(&past));
        assert!(
            now.0 > past.0 + jiff::SignedDuration::from_secs(4),
            "otherwise now"
        );
        assert!(renewed_after(None).0 <= jiff::Timestamp::now());
    }

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    /// A managed-fields entry: `manager` owns `fields`.
    fn managed_by(manager: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn an_agents_incarnation_counts_only_as_an_agent_wrote_it() {
        let owned_by = |manager: &str| {
            let key = format!("f:{INCARNATION_ANNOTATION}");
            managed_by(
                manager,
                serde_json::json!({"f:metadata": {"f:annotations": {key: {}}}}),
            )
        };
        let mut lease = Lease::default();
        assert!(!incarnation_stamped(&lease));
        set_annotation(&mut lease, INCARNATION_ANNOTATION, Some("p1"));
        assert!(incarnation_stamped(&lease), "stamped, whoever wrote it");
        assert_eq!(
            agent_incarnation(&lease),
            None,
            "no managed fields: not trusted"
        );
        lease.metadata.managed_fields = Some(vec![owned_by("kubectl-edit")]);
        assert_eq!(agent_incarnation(&lease), None, "set by hand");
        lease.metadata.managed_fields = Some(vec![owned_by(FIELD_MANAGER)]);
        assert_eq!(agent_incarnation(&lease), Some("p1"));
        set_annotation(&mut lease, INCARNATION_ANNOTATION, Some(""));
        assert_eq!(agent_incarnation(&lease), None, "an empty stamp is none");
        assert!(!incarnation_stamped(&lease));
    }

    /// The pod a term was taken in counts only as an agent wrote it, for the incarnation on the
    /// Lease: a value an earlier process left (an operator from before it was cleared on
    /// assignment, an agent from before it was written) proves nothing.
    #[test]
    fn the_pod_a_term_was_taken_in_counts_only_for_the_incarnation_that_took_it() {
        let by_agent = managed_by(
            FIELD_MANAGER,
            serde_json::json!({"f:metadata": {"f:annotations": {
                format!("f:{INCARNATION_ANNOTATION}"): {},
                format!("f:{TAKEN_IN_POD_ANNOTATION}"): {},
            }}}),
        );
        let mut lease = Lease::default();
        lease.metadata.managed_fields = Some(vec![by_agent]);
        set_annotation(&mut lease, INCARNATION_ANNOTATION, Some("p2"));
        set_annotation(
            &mut lease,
            TAKEN_IN_POD_ANNOTATION,
            Some(&taken_in("p2", "uid-1")),
        );
        assert_eq!(taken_in_pod(&lease), Some("uid-1"));
        set_annotation(
            &mut lease,
            TAKEN_IN_POD_ANNOTATION,
            Some(&taken_in("p1", "uid-0")),
        );
        assert_eq!(taken_in_pod(&lease), None, "left by an earlier process");
        set_annotation(&mut lease, TAKEN_IN_POD_ANNOTATION, Some("uid-0"));
        assert_eq!(taken_in_pod(&lease), None, "not a value an agent writes");
        set_annotation(&mut lease, INCARNATION_ANNOTATION, None);
        set_annotation(
            &mut lease,
            TAKEN_IN_POD_ANNOTATION,
            Some(&taken_in("p2", "uid-1")),
        );
        assert_eq!(taken_in_pod(&lease), None, "no take on the Lease");
    }

    #[test]
    fn only_a_release_arbiter_wrote_counts() {
        let owned_by = |manager: &str| {
            let fields = serde_json::json!({
                "f:metadata": { "f:annotations": { "f:arbiter.dev/released-by": {} } },
                "f:spec": { "f:holderIdentity": {} },
            });
            managed_by(manager, fields)
        };
        let mut lease = Lease::default();
        mark_released(&mut lease, Some("a"));
        assert_eq!(released_by(&lease), None, "no managed fields: not trusted");
        lease.metadata.managed_fields = Some(vec![owned_by(FIELD_MANAGER)]);
        assert_eq!(released_by(&lease), Some("a"));
        lease.metadata.managed_fields = Some(vec![owned_by("kubectl-patch")]);
        assert_eq!(released_by(&lease), None, "set by hand");
        lease.metadata.managed_fields = Some(vec![owned_by(FIELD_MANAGER)]);
        lease.spec.as_mut().unwrap().holder_identity = Some("b".into());
        assert_eq!(released_by(&lease), None, "held again");
    }

    #[test]
    fn empty_holder_is_no_holder_and_annotations_stand_in_for_gated_fields() {
        let mut lease = Lease::default();
        assert_eq!(holder(&lease), None);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(String::new()),
            ..LeaseSpec::default()
        });
        assert_eq!(holder(&lease), None);
        // The API server dropped the gated fields; the annotations remain.
        set_preferred_holder(&mut lease, Some("b"));
        set_strategy(&mut lease, "OldestEmulationVersion");
        let spec = lease.spec.as_mut().unwrap();
        spec.preferred_holder = None;
        spec.strategy = None;
        assert_eq!(preferred_holder(&lease), Some("b"));
        assert_eq!(strategy(&lease), Some("OldestEmulationVersion"));
        set_preferred_holder(&mut lease, None);
        assert_eq!(preferred_holder(&lease), None);
        assert_eq!(term(&lease), 0);
    }
}
