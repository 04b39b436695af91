//! The marks arbiter writes on objects (annotations on candidates, its field manager) and how
//! to tell its writes from hand edits. (The Lease's own annotation keys are in
//! [`crate::lease`].)

use super::LeaseCandidate;

/// The field manager of every write arbiter makes: what tells its annotations from a hand
/// edit ([`written_by_arbiter`]).
pub const FIELD_MANAGER: &str = "arbiter";

/// On a candidate, and on the Lease its agent holds: the agent's process incarnation (a random
/// id per start).
pub const INCARNATION_ANNOTATION: &str = "arbiter.dev/holder-incarnation";

/// The process incarnation a candidate's agent last stamped on it (as written: by its agent,
/// or by anyone who may write candidates).
pub fn incarnation(c: &LeaseCandidate) -> Option<&str> {
    use kube::ResourceExt;
    c.annotations()
        .get(INCARNATION_ANNOTATION)
        .map(String::as_str)
}

/// On a candidate: the term whose workload ran past the term's end, because the whole
/// candidate (agent, guard and workload) was paused. A successor may have run beside it; only a
/// resource that checks the fencing token was protected. Set by the agent, cleared when a new
/// process of that identity registers; the operator reports it (condition `DoubleHolder`).
pub const OVERRAN_ANNOTATION: &str = "arbiter.dev/overran-term";

/// On a candidate: its agent exited (after stopping its workload) and could not delete the
/// candidate, or kept it to carry [`OVERRAN_ANNOTATION`]. The arbiter never elects it; cleared
/// when a new process of that identity registers. It never ends a term early: whoever may
/// write candidates can write it (with arbiter's field manager too), so it is a claim.
pub const WITHDRAWN_ANNOTATION: &str = "arbiter.dev/withdrawn";

/// The incarnation a candidate says withdrew, if the mark counts: written by arbiter (its
/// field manager, not a hand edit), and naming the process the candidate currently records
/// (`arbiter.dev/holder-incarnation`): a late mark from an earlier process, or from a
/// duplicate of this identity, does not withdraw the process that runs now.
pub fn withdrawn_incarnation(c: &LeaseCandidate) -> Option<&str> {
    use kube::ResourceExt;
    let mark = c.annotations().get(WITHDRAWN_ANNOTATION)?;
    let current = incarnation(c)?;
    (!mark.is_empty() && mark == current && written_by_arbiter(&c.metadata, WITHDRAWN_ANNOTATION))
        .then_some(mark.as_str())
}

/// On a candidate, a Lease, a Deployment or StatefulSet (single-active) and a pod labelled
/// `arbiter.dev/inject`: the arbiter install (`arbiter operator --instance`) that arbitrates it.
/// An install without `--instance` arbitrates only what carries no such label. The operator
/// labels the Leases it makes with its instance and never writes one labelled with another.
pub const INSTANCE_LABEL: &str = "arbiter.dev/instance";

/// Whether `s` can name an install's instance: a label value, so that it can select what the
/// install arbitrates: at most 63 characters, letters, digits, `-`, `_` and `.`, beginning and
/// ending with a letter or digit (so never empty).
pub fn check_instance(s: &str) -> Result<(), String> {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && edge(s.chars().next())
        && edge(s.chars().last());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not an instance: at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
        ))
    }
}

/// The label selector of what install `instance` arbitrates (`None`: an install without one).
pub fn instance_selector(instance: Option<&str>) -> String {
    match instance {
        Some(i) => format!("{INSTANCE_LABEL}={i}"),
        None => format!("!{INSTANCE_LABEL}"),
    }
}

/// On a candidate: the lease duration its agent writes when it holds the lease, in seconds.
/// The arbiter waits at least this long for a holder whose Lease was edited by hand.
pub const LEASE_DURATION_ANNOTATION: &str = "arbiter.dev/lease-duration-seconds";

/// Whether annotation `key` was last written by arbiter (field manager [`FIELD_MANAGER`]), not
/// by a hand edit (`kubectl edit`, `kubectl annotate`, another tool). Without managed fields (an
/// API server that does not keep them) nothing was. Reads the managed fields as the API server
/// returns them, and as the operator's caches keep them: one entry of arbiter's whose `fieldsV1`
/// lists every annotation it owns (`operator::cache::slim::keep_arbiter_owned`).
pub fn written_by_arbiter(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> bool {
    let key = format!("f:{key}");
    meta.managed_fields
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|m| {
            m.fields_v1.as_ref().is_some_and(|f| match &f.0 {
                serde_json::Value::Array(owned) => owned.iter().any(|k| k.as_str() == Some(&key)),
                v => v
                    .get("f:metadata")
                    .and_then(|m| m.get("f:annotations")?.get(&key))
                    .is_some(),
            })
        })
        .is_some_and(|owner| owner.manager.as_deref() == Some(FIELD_MANAGER))
}
