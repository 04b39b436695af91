//! What a pod says of itself: the leases (and candidate names) its own containers run
//! `arbiter run` for.
//!
//! A candidate's `ownerReferences`, and the Lease's annotations, are written by agents and by
//! anyone with their rights: they are claims about some pod. What a pod's own spec says was set
//! by whoever created the pod. So the operator ties a pod to a lease only by the pod's word:
//!
//! - a container (or init container) whose command line runs `arbiter run` with `--lease NAME`
//!   (or `--lease=NAME`) among the agent's flags (before `--`; a word of CMD's own does not
//!   count, nor a command line built in a shell script), naming the candidate `--identity X`,
//!   or by default the pod's own name (`POD_NAME`);
//! - or the label `arbiter.dev/lease: NAME` (the candidate: the pod's name).
//!
//! Only such a pod is recorded as the pod a term was assigned in (its stop then ends the term
//! early), and only such a pod, or a pod of an annotated single-active workload, is ever
//! forced out.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::ResourceExt;

/// The label a pod may carry to declare the lease its candidate runs for (for a pod whose
/// containers do not show `arbiter run --lease NAME` in their command or args).
pub const LEASE_LABEL: &str = "arbiter.dev/lease";
/// On a cached (slimmed) pod only, written by the cache from the pod's spec and never taken
/// from the API server: the leases its containers' command lines name, comma-separated.
pub const LEASES_ANNOTATION: &str = "arbiter.dev/declared-leases";
/// Likewise: the candidate names (`--identity`) its containers' command lines give.
pub const IDENTITIES_ANNOTATION: &str = "arbiter.dev/declared-identities";
/// Likewise: the lease a pod labelled for injection runs its command for without an agent
/// ([`crate::workloads::unwrapped`]).
pub const UNWRAPPED_ANNOTATION: &str = "arbiter.dev/unwrapped-lease";

/// What a pod's containers' command lines declare.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Declared {
    pub leases: BTreeSet<String>,
    /// Explicit `--identity` values (without one, an agent's name is its pod's).
    pub identities: BTreeSet<String>,
}

/// Reads `arbiter run`'s flags in every container's command line of `spec`.
pub fn in_spec(spec: &PodSpec) -> Declared {
    let mut out = Declared::default();
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        let words: Vec<&str> = c
            .command
            .iter()
            .flatten()
            .chain(c.args.iter().flatten())
            .map(String::as_str)
            .collect();
        // The agent's flags: after its `run`, before the `--` that starts CMD.
        let Some(run) = words.iter().position(|w| *w == "run") else {
            continue;
        };
        let flags: Vec<&str> = words[run + 1..]
            .iter()
            .copied()
            .take_while(|w| *w != "--")
            .collect();
        for (i, w) in flags.iter().enumerate() {
            let value = |flag: &str| {
                w.strip_prefix(&format!("{flag}="))
                    .or_else(|| (*w == flag).then(|| flags.get(i + 1).copied()).flatten())
                    .map(str::to_string)
            };
            out.leases.extend(value("--lease"));
            out.identities.extend(value("--identity"));
        }
    }
    out
}

/// Notes on a pod about to be slimmed what its spec declares (the only annotations the
/// cache keeps: [`LEASES_ANNOTATION`], [`IDENTITIES_ANNOTATION`]).
pub fn note(pod: &mut Pod) {
    let declared = pod.spec.as_ref().map(in_spec).unwrap_or_default();
    let join = |s: BTreeSet<String>| s.into_iter().collect::<Vec<_>>().join(",");
    let mut notes = std::collections::BTreeMap::new();
    if !declared.leases.is_empty() {
        notes.insert(LEASES_ANNOTATION.to_string(), join(declared.leases));
    }
    if !declared.identities.is_empty() {
        notes.insert(IDENTITIES_ANNOTATION.to_string(), join(declared.identities));
    }
    if let Some(lease) = crate::workloads::unwrapped::unwrapped_lease(pod) {
        notes.insert(UNWRAPPED_ANNOTATION.to_string(), lease);
    }
    pod.metadata.annotations = (!notes.is_empty()).then_some(notes);
}

/// The lease a slimmed `pod` (see [`note`]) runs its command for unwrapped, if it does.
pub fn unwrapped_for(pod: &Pod) -> Option<&str> {
    pod.annotations()
        .get(UNWRAPPED_ANNOTATION)
        .map(String::as_str)
}

fn listed(pod: &Pod, annotation: &str, value: &str) -> bool {
    pod.annotations()
        .get(annotation)
        .is_some_and(|v| v.split(',').any(|x| x == value))
}

/// Whether a slimmed `pod` (see [`note`]) declares that it runs a candidate of `lease`.
pub fn declares(pod: &Pod, lease: &str) -> bool {
    pod.labels().get(LEASE_LABEL).is_some_and(|l| l == lease)
        || listed(pod, LEASES_ANNOTATION, lease)
}

/// Whether a slimmed `pod` declares that it runs candidate `holder` of `lease`: it declares
/// the lease, and the candidate is named so by its command line or is the pod's own name.
pub fn declares_holder(pod: &Pod, lease: &str, holder: &str) -> bool {
    declares(pod, lease) && (pod.name_any() == holder || listed(pod, IDENTITIES_ANNOTATION, holder))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn slim(mut p: Pod) -> Pod {
        crate::cache::slim::keep_what_is_read(&mut p);
        p
    }

    fn with_args(args: serde_json::Value) -> Pod {
        slim(pod(serde_json::json!({
            "metadata": {"name": "web-0"},
            "spec": {"containers": [
                {"name": "app", "image": "x"},
                {"name": "agent", "image": "x", "command": ["/arbiter"], "args": args},
            ]}
        })))
    }

    #[test]
    fn a_pod_declares_a_lease_by_its_own_command_line_or_label() {
        let yes = |args: serde_json::Value| declares(&with_args(args), "l");
        assert!(yes(serde_json::json!(["run", "--lease", "l", "--", "app"])));
        assert!(yes(serde_json::json!(["run", "--lease=l", "--", "app"])));
        assert!(!yes(serde_json::json!(["run", "--lease", "other"])));
        assert!(!yes(serde_json::json!(["run", "--lease"])));
        assert!(
            !yes(serde_json::json!(["echo", "--lease", "l"])),
            "not arbiter run"
        );
        assert!(
            !yes(serde_json::json!([
                "run", "--lease", "x", "--", "app", "--lease", "l"
            ])),
            "CMD's own words"
        );
        assert!(
            !yes(serde_json::json!(["-c", "arbiter run --lease l -- app"])),
            "a shell script's"
        );
        let init = slim(pod(
            serde_json::json!({"spec": {"containers": [{"name": "a", "image": "x"}],
            "initContainers": [{"name": "i", "image": "x", "command": ["arbiter", "run", "--lease", "l"]}]}}),
        ));
        assert!(declares(&init, "l"));
        let labelled = pod(serde_json::json!({"metadata": {"labels": {"arbiter.dev/lease": "l"}}}));
        assert!(declares(&slim(labelled.clone()), "l"));
        assert!(!declares(&slim(labelled), "m"));
        // An annotation the pod came with is no declaration: the cache writes its own.
        let annotated = pod(serde_json::json!({"metadata": {"annotations": {
            "arbiter.dev/lease": "l", "arbiter.dev/declared-leases": "l",
        }}}));
        assert!(!declares(&slim(annotated), "l"));
    }

    #[test]
    fn a_pod_declares_the_candidate_it_runs_by_its_name_or_identity_flag() {
        let own = with_args(serde_json::json!(["run", "--lease", "l", "--", "app"]));
        assert!(
            declares_holder(&own, "l", "web-0"),
            "POD_NAME: the pod's own"
        );
        assert!(!declares_holder(&own, "l", "elsewhere"));
        let named = with_args(serde_json::json!(["run", "--identity=w", "--lease", "l"]));
        assert!(declares_holder(&named, "l", "w"));
        assert!(!declares_holder(&named, "m", "w"), "another lease");
    }
}
