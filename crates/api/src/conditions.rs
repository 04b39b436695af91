//! The condition types a LeaseCandidate's status carries: written by the operator when a
//! candidate has something to report, read by `arbiter status`, `arbiter handover` and users.
//! (Who holds a lease is the Lease's: `holderIdentity`, `leaseTransitions`.)

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Written by earlier versions on every candidate (True on the holder): removed from a
/// candidate's status when it is next written.
pub const LEADER: &str = "Leader";
/// Whether the candidate may take part in its lease's election (version, skew, pod, answers).
pub const ELIGIBLE: &str = "Eligible";
/// True when candidates at the highest binary version declare different strategies.
pub const STRATEGY_CONFLICT: &str = "StrategyConflict";
/// True when the candidate's version is further from the others' than the skew allowed.
pub const SKEW_VIOLATION: &str = "SkewViolation";
/// True when two live processes use the candidate's identity.
pub const DUPLICATE_IDENTITY: &str = "DuplicateIdentity";
/// True when the candidate's workload ran past the end of an earlier term (it was paused).
pub const DOUBLE_HOLDER: &str = "DoubleHolder";

/// Whether `type_` is True in `conditions`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}
