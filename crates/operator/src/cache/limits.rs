//! Per-namespace limits on what the operator arbitrates (`--max-candidates-per-namespace`,
//! `--max-leases-per-namespace`), so that one namespace cannot take the operator's memory, and
//! so every namespace's elections, with it.
//!
//! A namespace's candidates are admitted oldest first (by creation time, then uid) while they
//! fit: at most the candidate limit in all, naming at most the lease limit of distinct leases.
//! A candidate that does not fit is refused: the watch keeps only a stub of it (its name, uid,
//! lease, creation time and conditions: what reporting it needs), it is never indexed, elected
//! or followed, and the acting replica marks it `Eligible=False` (`LimitExceeded`) with a
//! Warning Event. Admitted candidates stay admitted while they exist, so the elections going on
//! are never cut off by newer candidates; a refused one is admitted at its next event once
//! there is room (agents refresh their candidates every 5 minutes).
//!
//! After a restart the order is the candidates' creation order (then their names, for those
//! created in the same second), not the order the list delivers them in: a paginated list of
//! the candidates, of which only these few fields are kept, is judged first ([`plan`]), and the
//! watch's list follows that plan. A relist of a running operator keeps what it admitted
//! first, then judges the rest in that order.
//!
//! A stub carries [`STUB_ANNOTATION`] (never written to the API server): the cache may still
//! hold a stub of a candidate a relist has just admitted, until the relist ends, and
//! [`is_stub`] keeps it out of the elections meanwhile.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use arbiter_api::{LeaseCandidate, LeaseCandidateSpec, LeaseCandidateStatus};

/// On a stub, in the operator's cache only.
pub const STUB_ANNOTATION: &str = "arbiter.dev/limits-stub";

/// Whether `c` is a stub of a refused candidate (see [`STUB_ANNOTATION`]).
pub fn is_stub(c: &LeaseCandidate) -> bool {
    c.annotations().contains_key(STUB_ANNOTATION)
}

/// Drops the stub marker from a candidate as the API server delivered it: the marker is the
/// cache's own, and anyone who may annotate a candidate could otherwise keep it (a holder's
/// included) out of every election.
pub fn clear_stub_marker(c: &mut LeaseCandidate) {
    if let Some(a) = c.metadata.annotations.as_mut() {
        a.remove(STUB_ANNOTATION);
    }
}

/// The limits, per namespace (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub candidates: usize,
    pub leases: usize,
}

impl Limits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.candidates > 0 || self.leases > 0
    }
}

/// Which limit a refused candidate is beyond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exceeded {
    Candidates(usize),
    Leases(usize),
}

impl Exceeded {
    /// The condition's message.
    pub fn message(&self, namespace: &str) -> String {
        match self {
            Exceeded::Candidates(n) => format!(
                "namespace {namespace} already has {n} candidates, the operator's limit (--max-candidates-per-namespace); this one is not elected until older ones are deleted"
            ),
            Exceeded::Leases(n) => format!(
                "namespace {namespace} already has candidates for {n} leases, the operator's limit (--max-leases-per-namespace); this one names another lease and is not elected until some leases have no candidates left"
            ),
        }
    }
}

/// One candidate as the limits see it. Sorted as judged: by namespace, then oldest first (by
/// creation time, then name: creation times have whole seconds).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listed {
    pub namespace: String,
    /// RFC 3339, as the API server wrote it (whole seconds: sorts as it reads).
    pub created: String,
    pub name: String,
    pub uid: String,
    pub lease: String,
}

impl Listed {
    pub fn of(c: &LeaseCandidate) -> Listed {
        Listed {
            namespace: c.namespace().unwrap_or_default(),
            created: c
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            name: c.name_any(),
            uid: c.uid().unwrap_or_default(),
            lease: c.spec.lease_name.clone(),
        }
    }
}

/// One namespace's admitted candidates.
#[derive(Debug, Default)]
struct Namespace {
    /// uid → the lease it names.
    admitted: HashMap<String, String>,
    /// lease → how many admitted candidates name it.
    leases: HashMap<String, usize>,
}

impl Namespace {
    /// Whether a candidate not admitted yet, naming `lease`, fits beside those admitted.
    fn judge(&self, limits: Limits, lease: &str) -> Result<(), Exceeded> {
        if limits.candidates > 0 && self.admitted.len() >= limits.candidates {
            return Err(Exceeded::Candidates(limits.candidates));
        }
        if limits.leases > 0
            && !self.leases.contains_key(lease)
            && self.leases.len() >= limits.leases
        {
            return Err(Exceeded::Leases(limits.leases));
        }
        Ok(())
    }

    fn admit(&mut self, uid: &str, lease: &str) {
        if self
            .admitted
            .insert(uid.to_string(), lease.to_string())
            .is_none()
        {
            *self.leases.entry(lease.to_string()).or_default() += 1;
        }
    }

    /// Forgets `uid`; whether it was admitted.
    fn remove(&mut self, uid: &str) -> bool {
        let Some(lease) = self.admitted.remove(uid) else {
            return false;
        };
        if let Some(n) = self.leases.get_mut(&lease) {
            *n -= 1;
            if *n == 0 {
                self.leases.remove(&lease);
            }
        }
        true
    }
}

/// Listed candidates judged in creation order (per namespace, oldest first).
#[derive(Debug, Default)]
pub struct Plan {
    /// Each one's verdict: `Ok` admitted, or the limit it is beyond.
    verdicts: HashMap<String, Result<(), Exceeded>>,
    /// The namespaces' admitted candidates.
    namespaces: HashMap<String, Namespace>,
}

/// Judges `listed` in creation order, after those `kept` says are admitted already (they stay
/// admitted: elections going on are never cut off by a relist).
pub fn plan(mut listed: Vec<Listed>, limits: Limits, kept: impl Fn(&str) -> bool) -> Plan {
    listed.sort();
    let mut plan = Plan::default();
    let (first, rest): (Vec<Listed>, Vec<Listed>) = listed.into_iter().partition(|l| kept(&l.uid));
    for l in first {
        let ns = plan.namespaces.entry(l.namespace).or_default();
        ns.admit(&l.uid, &l.lease);
        plan.verdicts.insert(l.uid, Ok(()));
    }
    for l in rest {
        let ns = plan.namespaces.entry(l.namespace).or_default();
        let verdict = ns.judge(limits, &l.lease);
        if verdict.is_ok() {
            ns.admit(&l.uid, &l.lease);
        }
        plan.verdicts.insert(l.uid, verdict);
    }
    plan
}

/// A refused candidate, for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub exceeded: Exceeded,
    pub created: String,
    pub lease: String,
}

/// A relist under way, over one namespace or all (its scope).
#[derive(Debug, Default)]
struct Relist {
    /// The verdicts it follows for the candidates listed before it.
    verdicts: HashMap<String, Result<(), Exceeded>>,
    /// Uids delivered since it began.
    seen: HashSet<String>,
}

#[derive(Debug, Default)]
struct State {
    namespaces: HashMap<String, Namespace>,
    /// Refused candidates by uid.
    refused: HashMap<String, Refused>,
    /// Candidates admitted when room was made, that the cache holds only as a stub: (namespace,
    /// name) by uid. The report touches their status, so that the watch delivers them whole.
    promoted: HashMap<String, (String, String)>,
    /// Relists under way, by scope (a namespace, or `None`: all).
    relists: HashMap<Option<String>, Relist>,
}

fn in_scope(scope: Option<&str>, namespace: &str) -> bool {
    scope.is_none_or(|s| s == namespace)
}

impl State {
    /// Admits the oldest refused candidates of `namespace` that now fit.
    fn promote(&mut self, limits: Limits, namespace: &str) -> bool {
        let mut waiting: Vec<&Refused> = self
            .refused
            .values()
            .filter(|r| r.namespace == namespace)
            .collect();
        waiting.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
        let ns = self.namespaces.entry(namespace.to_string()).or_default();
        let mut admitted = Vec::new();
        for r in waiting {
            if limits.candidates > 0 && ns.admitted.len() >= limits.candidates {
                break;
            }
            if ns.judge(limits, &r.lease).is_ok() {
                ns.admit(&r.uid, &r.lease);
                admitted.push((r.uid.clone(), r.name.clone()));
            }
        }
        let any = !admitted.is_empty();
        for (uid, name) in admitted {
            self.refused.remove(&uid);
            self.promoted.insert(uid, (namespace.to_string(), name));
        }
        any
    }
}

/// The limits' state, kept by the candidate watch (every replica), read by the report.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    limits: Limits,
    state: Arc<Mutex<State>>,
    /// Wakes the report when a candidate is refused or admitted after all.
    changes: Arc<tokio::sync::Notify>,
}

impl Tally {
    pub fn new(limits: Limits) -> Tally {
        Tally {
            limits,
            ..Tally::default()
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A relist of `scope` (a namespace, or all) begins, with `listed` (`None`: that list
    /// failed) judged by [`plan`]: the scope's admitted candidates are the plan's from now on
    /// (so that one created since is judged against them, not against those delivered so
    /// far). Without a list, what was admitted stays, and new candidates are judged as they
    /// come.
    pub fn relist(&self, scope: Option<&str>, listed: Option<Vec<Listed>>) {
        let mut s = self.state.lock().unwrap();
        let Some(listed) = listed else {
            s.relists.insert(scope.map(String::from), Relist::default());
            return;
        };
        let plan = {
            let admitted = |uid: &str| {
                s.namespaces
                    .values()
                    .any(|ns| ns.admitted.contains_key(uid))
            };
            plan(listed, self.limits, admitted)
        };
        s.namespaces.retain(|ns, _| !in_scope(scope, ns));
        s.namespaces.extend(plan.namespaces);
        let relist = Relist {
            verdicts: plan.verdicts,
            seen: HashSet::new(),
        };
        s.relists.insert(scope.map(String::from), relist);
    }

    /// The relist of `scope` ended: whatever it did not list is gone, and its room goes to the
    /// oldest refused candidates.
    pub fn relisted(&self, scope: Option<&str>) {
        let mut s = self.state.lock().unwrap();
        let Some(relist) = s.relists.remove(&scope.map(String::from)) else {
            return;
        };
        let listed = |ns: &str, uid: &str| !in_scope(scope, ns) || relist.seen.contains(uid);
        s.refused.retain(|uid, r| listed(&r.namespace, uid));
        s.promoted.retain(|uid, (ns, _)| listed(ns, uid));
        for (name, ns) in s.namespaces.iter_mut() {
            let gone: Vec<String> = (ns.admitted.keys())
                .filter(|uid| !listed(name, uid))
                .cloned()
                .collect();
            for uid in gone {
                ns.remove(&uid);
            }
        }
        let names: Vec<String> = (s.namespaces.keys())
            .filter(|ns| in_scope(scope, ns))
            .cloned()
            .collect();
        let mut promoted = false;
        for ns in names {
            promoted |= s.promote(self.limits, &ns);
        }
        s.namespaces.retain(|_, ns| !ns.admitted.is_empty());
        drop(s);
        if promoted {
            self.changes.notify_one();
        }
    }

    /// A candidate delivered by the watch: admitted (`true`), or refused, and then cut down to
    /// a stub in place.
    pub fn apply(&self, c: &mut LeaseCandidate) -> bool {
        if !self.limits.any() {
            return true;
        }
        let l = Listed::of(c);
        let mut s = self.state.lock().unwrap();
        let scope = [Some(l.namespace.clone()), None]
            .into_iter()
            .find(|scope| s.relists.contains_key(scope));
        let planned = scope.and_then(|scope| {
            let relist = s.relists.get_mut(&scope)?;
            relist.seen.insert(l.uid.clone());
            relist.verdicts.get(&l.uid).copied()
        });
        let ns = s.namespaces.entry(l.namespace.clone()).or_default();
        let verdict = match planned {
            // Admitted stays admitted (a lease name never changes).
            _ if ns.admitted.contains_key(&l.uid) => Ok(()),
            // Judged in creation order before this list.
            Some(Err(e)) => Err(e),
            _ => ns.judge(self.limits, &l.lease),
        };
        match verdict {
            Ok(()) => {
                ns.admit(&l.uid, &l.lease);
                s.refused.remove(&l.uid);
                // Delivered whole.
                s.promoted.remove(&l.uid);
                true
            }
            Err(exceeded) => {
                let refused = Refused {
                    namespace: l.namespace,
                    name: l.name,
                    uid: l.uid.clone(),
                    exceeded,
                    created: l.created,
                    lease: l.lease,
                };
                let new = s.refused.insert(l.uid, refused.clone()) != Some(refused);
                drop(s);
                stub(c);
                if new {
                    self.changes.notify_one();
                }
                false
            }
        }
    }

    /// A candidate deleted: its room goes to the oldest refused candidates of its namespace.
    pub fn delete(&self, c: &LeaseCandidate) {
        let (uid, namespace) = (
            c.uid().unwrap_or_default(),
            c.namespace().unwrap_or_default(),
        );
        let mut s = self.state.lock().unwrap();
        s.refused.remove(&uid);
        s.promoted.remove(&uid);
        let freed = s
            .namespaces
            .get_mut(&namespace)
            .is_some_and(|ns| ns.remove(&uid));
        if freed && s.promote(self.limits, &namespace) {
            drop(s);
            self.changes.notify_one();
        }
    }

    /// Whether the candidate with this uid is refused, or admitted but cached only as a stub.
    pub fn is_refused(&self, uid: &str) -> bool {
        let s = self.state.lock().unwrap();
        s.refused.contains_key(uid) || s.promoted.contains_key(uid)
    }

    /// Every refused candidate.
    pub fn refused(&self) -> Vec<Refused> {
        self.state
            .lock()
            .unwrap()
            .refused
            .values()
            .cloned()
            .collect()
    }

    /// Candidates admitted after all, cached as stubs until the watch delivers them again:
    /// (namespace, name, uid).
    pub fn promoted(&self) -> Vec<(String, String, String)> {
        let s = self.state.lock().unwrap();
        (s.promoted.iter())
            .map(|(uid, (ns, name))| (ns.clone(), name.clone(), uid.clone()))
            .collect()
    }

    /// Wakes the reports as if a candidate had been refused (a namespace came to be
    /// arbitrated: its refusals and admissions are reported now).
    pub fn nudge(&self) {
        self.changes.notify_one();
    }

    /// Waits until a candidate is refused or admitted after all (or was since the last call).
    pub async fn changed(&self) {
        self.changes.notified().await
    }
}

/// Cuts a refused candidate down to what its report needs.
fn stub(c: &mut LeaseCandidate) {
    let m = std::mem::take(&mut c.metadata);
    c.metadata = ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        creation_timestamp: m.creation_timestamp,
        annotations: Some([(STUB_ANNOTATION.to_string(), "true".to_string())].into()),
        ..ObjectMeta::default()
    };
    c.spec = LeaseCandidateSpec {
        lease_name: std::mem::take(&mut c.spec.lease_name),
        binary_version: String::new(),
        emulation_version: None,
        strategy: String::new(),
        ping_time: None,
        renew_time: None,
    };
    c.status = c.status.take().map(|s| LeaseCandidateStatus {
        conditions: s.conditions,
        ..LeaseCandidateStatus::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(ns: &str, created: u32, uid: &str, lease: &str) -> Listed {
        Listed {
            namespace: ns.into(),
            created: format!("2026-01-01T00:00:{created:02}Z"),
            name: format!("name-{uid}"),
            uid: uid.into(),
            lease: lease.into(),
        }
    }

    #[test]
    fn the_oldest_candidates_fit_first_per_namespace() {
        let limits = Limits {
            candidates: 3,
            leases: 2,
        };
        // Listed out of creation order.
        let p = plan(
            vec![
                listed("a", 5, "a5", "x"),
                listed("a", 1, "a1", "x"),
                listed("a", 2, "a2", "y"),
                listed("a", 3, "a3", "z"),
                listed("a", 4, "a4", "y"),
                listed("b", 9, "b9", "z"),
            ],
            limits,
            |_| false,
        );
        let v = &p.verdicts;
        assert_eq!(v["a1"], Ok(()));
        assert_eq!(v["a2"], Ok(()));
        assert_eq!(v["a3"], Err(Exceeded::Leases(2)), "a third lease");
        assert_eq!(v["a4"], Ok(()), "an admitted lease, the third candidate");
        assert_eq!(v["a5"], Err(Exceeded::Candidates(3)));
        assert_eq!(v["b9"], Ok(()), "another namespace has its own limits");
    }

    #[test]
    fn no_limit_admits_everything() {
        let p = plan(
            (0..50)
                .map(|i| listed("a", i % 60, &format!("u{i}"), &format!("l{i}")))
                .collect(),
            Limits::default(),
            |_| false,
        );
        assert!(p.verdicts.values().all(|v| v.is_ok()));
    }

    fn candidate(name: &str, uid: &str, lease: &str, created: u32) -> LeaseCandidate {
        let mut c = LeaseCandidate::new(
            name,
            LeaseCandidateSpec {
                lease_name: lease.into(),
                binary_version: "1.30.0".into(),
                emulation_version: None,
                strategy: arbiter_api::OLDEST_EMULATION_VERSION.into(),
                ping_time: None,
                renew_time: None,
            },
        );
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some(uid.into());
        c.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        c.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            format!("2026-01-01T00:00:{created:02}Z").parse().unwrap(),
        ));
        c
    }

    #[test]
    fn a_refused_candidate_is_cut_down_and_the_oldest_gets_the_room_made() {
        let tally = Tally::new(Limits {
            candidates: 2,
            leases: 0,
        });
        let mut a = candidate("a", "ua", "l", 1);
        assert!(tally.apply(&mut a));
        assert!(tally.apply(&mut candidate("b", "ub", "l", 2)));
        let mut d = candidate("d", "ud", "l", 4);
        assert!(!tally.apply(&mut d));
        assert!(is_stub(&d), "a stub: {d:?}");
        assert_eq!(d.metadata.annotations.as_ref().map(|a| a.len()), Some(1));
        assert_eq!(d.spec.lease_name, "l");
        assert!(!tally.apply(&mut candidate("c", "uc", "l", 3)));
        assert_eq!(tally.refused().len(), 2);
        assert_eq!(tally.refused()[0].exceeded, Exceeded::Candidates(2));
        // The admitted stay admitted through their updates.
        assert!(tally.apply(&mut a.clone()));
        // a goes: the oldest refused (c, not d) is admitted, cached as a stub until delivered.
        tally.delete(&a);
        assert_eq!(tally.promoted(), [("ns".into(), "c".into(), "uc".into())]);
        assert!(tally.is_refused("uc"), "only a stub is cached");
        let whole = candidate("c", "uc", "l", 3);
        let mut again = whole.clone();
        assert!(tally.apply(&mut again));
        assert_eq!(again.metadata, whole.metadata, "kept whole");
        assert!(!tally.is_refused("uc"));
        assert!(tally.promoted().is_empty());
        // d's next event: still no room.
        assert!(!tally.apply(&mut candidate("d", "ud", "l", 4)));
    }

    #[test]
    fn a_relist_follows_creation_order_not_list_order() {
        let limits = Limits {
            candidates: 1,
            leases: 0,
        };
        let tally = Tally::new(limits);
        tally.relist(
            None,
            Some(vec![listed("ns", 1, "uo", "l"), listed("ns", 2, "un", "l")]),
        );
        // The list delivers the newer first; one created after the plan comes before the
        // older too: judged against the plan's admitted, it does not take the older's place.
        assert!(!tally.apply(&mut candidate("new", "un", "l", 2)));
        assert!(!tally.apply(&mut candidate("later", "ul", "l", 3)));
        assert!(tally.apply(&mut candidate("old", "uo", "l", 1)));
        tally.relisted(None);
        assert_eq!(tally.refused().len(), 2);
        // A relist that no longer lists the older: its room goes to the oldest refused.
        tally.relist(
            None,
            Some(vec![listed("ns", 2, "un", "l"), listed("ns", 3, "ul", "l")]),
        );
        assert!(!tally.apply(&mut candidate("later", "ul", "l", 3)));
        assert!(tally.apply(&mut candidate("new", "un", "l", 2)));
        tally.relisted(None);
        assert_eq!(tally.refused().len(), 1);
        assert!(tally.promoted().is_empty(), "new was delivered whole");
    }

    #[test]
    fn a_relist_keeps_what_was_admitted_before_older_refused_candidates() {
        let limits = Limits {
            candidates: 0,
            leases: 1,
        };
        let tally = Tally::new(limits);
        let a = candidate("a", "ua", "l1", 1);
        assert!(tally.apply(&mut a.clone()));
        assert!(!tally.apply(&mut candidate("c", "uc", "l2", 2)));
        assert!(tally.apply(&mut candidate("d", "ud", "l1", 3)));
        tally.delete(&a);
        assert!(tally.promoted().is_empty(), "l1 still has d");
        // A relist: c is older than d, but d holds l1's election.
        tally.relist(
            None,
            Some(vec![
                listed("ns", 2, "uc", "l2"),
                listed("ns", 3, "ud", "l1"),
            ]),
        );
        assert!(!tally.apply(&mut candidate("c", "uc", "l2", 2)));
        assert!(tally.apply(&mut candidate("d", "ud", "l1", 3)));
        tally.relisted(None);
        // Without the list (it failed): what was admitted stays.
        tally.relist(None, None);
        assert!(!tally.apply(&mut candidate("c", "uc", "l2", 2)));
        assert!(tally.apply(&mut candidate("d", "ud", "l1", 3)));
        tally.relisted(None);
        assert_eq!(tally.refused().len(), 1);
    }

    #[test]
    fn a_stub_is_marked_and_kept_out() {
        let tally = Tally::new(Limits {
            candidates: 1,
            leases: 0,
        });
        assert!(tally.apply(&mut candidate("a", "ua", "l", 1)));
        let mut b = candidate("b", "ub", "l", 2);
        assert!(!tally.apply(&mut b));
        assert!(is_stub(&b));
        assert!(!is_stub(&candidate("a", "ua", "l", 1)));
        // The marker written by hand on a candidate the API server delivers is not taken.
        let mut forged = candidate("a", "ua", "l", 1);
        forged
            .annotations_mut()
            .insert(STUB_ANNOTATION.into(), "true".into());
        clear_stub_marker(&mut forged);
        assert!(!is_stub(&forged));
        assert!(tally.apply(&mut forged) && !is_stub(&forged));
    }

    #[test]
    fn a_namespaces_relist_leaves_the_others_alone() {
        let limits = Limits {
            candidates: 1,
            leases: 0,
        };
        let tally = Tally::new(limits);
        let mut other = candidate("o", "uo", "l", 1);
        other.metadata.namespace = Some("other".into());
        assert!(tally.apply(&mut other));
        tally.relist(Some("ns"), Some(vec![listed("ns", 1, "ua", "l")]));
        assert!(tally.apply(&mut candidate("a", "ua", "l", 1)));
        tally.relisted(Some("ns"));
        // other's candidate is still admitted: a second one there is refused.
        let mut second = candidate("p", "up", "l", 2);
        second.metadata.namespace = Some("other".into());
        assert!(!tally.apply(&mut second));
    }

    #[test]
    fn a_lease_beyond_the_limit_waits_for_a_lease_to_go() {
        let tally = Tally::new(Limits {
            candidates: 0,
            leases: 1,
        });
        let x = candidate("a", "ua", "x", 1);
        assert!(tally.apply(&mut x.clone()));
        assert!(tally.apply(&mut candidate("b", "ub", "x", 2)));
        assert!(!tally.apply(&mut candidate("c", "uc", "y", 3)));
        assert_eq!(tally.refused()[0].exceeded, Exceeded::Leases(1));
        tally.delete(&x);
        assert!(tally.promoted().is_empty(), "x still has b");
        tally.delete(&candidate("b", "ub", "x", 2));
        assert_eq!(tally.promoted().len(), 1, "y takes x's place");
    }
}
