//! The `LeaseCandidate` custom resource (`arbiter.dev/v1alpha1`).
//!
//! The shape follows upstream's `coordination.k8s.io/v1beta1` LeaseCandidate, plus a status
//! subresource that the operator writes. Bad specs are refused at admission by the schema
//! (OpenAPI + CEL rules below), so the operator only ever sees well-formed candidates.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use arbiter_election::strategy::OLDEST_EMULATION_VERSION;

/// A DNS-1123 subdomain (the rule for Lease names), as a regex inside a CEL string literal.
const DNS_SUBDOMAIN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A semantic version (semver.org's own expression, with `[.]` for `\.` and `[0-9]` for `\d`,
/// so that it needs no escape inside a CEL string literal): what CEL's `isSemver` accepts, as
/// a regex. The CRD's rules use no CEL semver library: Kubernetes 1.33 refuses a CRD whose
/// rules name `isSemver` or `semver()` (new rules may use a library only from the release
/// after the one that added it).
const SEMVER: &str = "^(0|[1-9][0-9]*)[.](0|[1-9][0-9]*)[.](0|[1-9][0-9]*)\
(-(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)([.](0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*)?\
([+][0-9a-zA-Z-]+([.][0-9a-zA-Z-]+)*)?$";

/// The CEL rule that `version` (a CEL expression) is a semantic version.
fn semver_rule(version: &str) -> String {
    format!("{version}.matches('{SEMVER}')")
}

/// The CEL rule that `emulationVersion` is not above `binaryVersion`, without the semver
/// library: MAJOR, MINOR and PATCH compared as numbers, then a pre-release is below the release
/// (two pre-releases of one version are not compared here: the operator refuses a candidate
/// whose emulationVersion is above its binaryVersion whatever admission let through).
fn emulation_not_above_binary() -> String {
    let part = |v: &str, i: usize| {
        format!("int(self.{v}.find('^[0-9]+[.][0-9]+[.][0-9]+').split('.')[{i}])")
    };
    let pre = |v: &str| format!("self.{v}.split('+', 2)[0].indexOf('-') >= 0");
    let (e, b) = ("emulationVersion", "binaryVersion");
    let below = |i: usize| format!("{} < {}", part(e, i), part(b, i));
    let same = |i: usize| format!("{} == {}", part(e, i), part(b, i));
    format!(
        "!has(self.{e}) || !{} || !{} || {} || ({} && ({} || ({} && ({} || ({} && (!({}) || {}))))))",
        semver_rule(&format!("self.{e}")),
        semver_rule(&format!("self.{b}")),
        below(0),
        same(0),
        below(1),
        same(1),
        below(2),
        same(2),
        pre(b),
        pre(e),
    )
}

/// A candidate for one Lease. The arbiter elects among the candidates that name the same
/// `leaseName` in the same namespace, and writes the winner into the Lease's `holderIdentity`.
/// The candidate's `metadata.name` is its identity: the name it appears under as holder.
// clippy reads the repeated `printcolumn(type_ = ...)` keys of the derive as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "arbiter.dev",
    version = "v1alpha1",
    kind = "LeaseCandidate",
    doc = "A candidate for a Lease that the arbiter elects a holder for.",
    namespaced,
    status = "LeaseCandidateStatus",
    shortname = "alc",
    category = "arbiter",
    printcolumn(name = "Lease", type_ = "string", json_path = ".spec.leaseName"),
    printcolumn(name = "Binary", type_ = "string", json_path = ".spec.binaryVersion"),
    printcolumn(
        name = "Emulation",
        type_ = "string",
        json_path = ".spec.emulationVersion"
    ),
    printcolumn(name = "Strategy", type_ = "string", json_path = ".spec.strategy"),
    printcolumn(
        name = "Eligible",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Eligible\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Eligible\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(
    "self.strategy != 'OldestEmulationVersion' || has(self.emulationVersion)"
).message("emulationVersion is required when strategy is OldestEmulationVersion"))]
#[x_kube(validation = Rule::new(emulation_not_above_binary())
    .message("emulationVersion must not be greater than binaryVersion"))]
#[serde(rename_all = "camelCase")]
pub struct LeaseCandidateSpec {
    /// Name of the Lease (in the candidate's namespace) this candidate competes for. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("leaseName is immutable"))]
    #[x_kube(validation = Rule::new(format!("self.matches('{DNS_SUBDOMAIN}')"))
        .message("leaseName must be a valid Lease name: lowercase letters, digits, '-' and '.'"))]
    #[schemars(length(min = 1, max = 253))]
    pub lease_name: String,

    /// The version of the binary the candidate runs, a semantic version such as `1.31.0`.
    #[x_kube(validation = Rule::new(semver_rule("self"))
        .message("binaryVersion must be a semantic version MAJOR.MINOR.PATCH, such as 1.31.0"))]
    #[schemars(length(min = 1, max = 64))]
    pub binary_version: String,

    /// The version whose behaviour the candidate emulates (at most `binaryVersion`). Required
    /// for the OldestEmulationVersion strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(semver_rule("self"))
        .message("emulationVersion must be a semantic version MAJOR.MINOR.PATCH, such as 1.31.0"))]
    #[schemars(length(min = 1, max = 64))]
    pub emulation_version: Option<String>,

    /// How the holder is chosen: `OldestEmulationVersion`, or a qualified third-party name such
    /// as `example.com/my-strategy` (the arbiter then creates the Lease and leaves it alone).
    #[x_kube(validation = Rule::new("self == 'OldestEmulationVersion' || self.contains('/')")
        .message("unknown strategy: the only built-in strategy is OldestEmulationVersion; a third-party strategy is a qualified name such as example.com/my-strategy"))]
    #[x_kube(validation = Rule::new(
        r"!self.contains('/') || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$')"
    ).message("a third-party strategy must be a qualified name PREFIX/NAME with exactly one '/', such as example.com/my-strategy"))]
    #[schemars(length(min = 1, max = 316))]
    pub strategy: String,

    /// Set by the arbiter to ask the candidate to confirm it is alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ping_time: Option<MicroTime>,

    /// Set by the candidate when it registers, periodically, and to acknowledge a ping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<MicroTime>,
}

/// What the arbiter observed about a candidate.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeaseCandidateStatus {
    /// `Eligible`, `Leader`, `StrategyConflict`, `SkewViolation`, ...
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    // An atomic list, not the usual list-map keyed by `type`: arbiter is the conditions' only
    // writer and replaces the whole list at each write (a JSON merge patch), so per-condition
    // field ownership buys nothing, and it costs kube-apiserver a fifth to two fifths of every
    // status write (`make bench`, the write-cost tables). Nothing to migrate:
    // each object is tracked the new way from its next write, and applying the CRD replaces
    // `spec.versions` whole (docs/reference/leasecandidate.md).
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub conditions: Vec<Condition>,

    /// Not set by arbiter (kept so that a value an earlier version wrote can be read and
    /// removed): `pingTime` and `renewTime` are in the spec, so the generation changes at every
    /// ping and refresh while the conditions do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
