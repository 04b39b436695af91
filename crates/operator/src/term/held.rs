//! What the arbiter remembers of each lease's holder, on its own clock, so that no edit of the
//! Lease object (deleting it, clearing or replacing `holderIdentity`, lowering
//! `leaseDurationSeconds`, rewriting `arbiter.dev/holder-pod-uid`) can shorten a term.
//!
//! For each lease: the holder, when the last record naming it was first seen, the longest
//! duration it was given or wrote, and the pod uid recorded when the arbiter assigned it. The
//! election core turns this into [`arbiter_election::decide::Previous`]. The memory is replaced only by the
//! arbiter's own assignment, or once the remembered term is certainly over.
//!
//! After a restart (or an HA failover) the memory starts empty: a holder is learned from the
//! Lease when first seen (with at least the longest duration any of the lease's candidates
//! declares, and the arbiter's own, in case the record was edited already), or, when the Lease
//! is gone or names nobody without its holder having released it, from the lease's term mark,
//! which says whether a term was handed out before: then an unknown holder
//! ([`UNKNOWN_HOLDER`]) is presumed to run, for as long, from that moment.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arbiter_election::decide::Previous;

use crate::key::LeaseKey;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Term {
    holder: String,
    /// When the last record naming the holder was first seen.
    last_seen: Instant,
    duration: Duration,
    /// The holder's pod, as recorded when the arbiter assigned it (or first saw it).
    pod_uid: Option<String>,
    /// The holder's process (`arbiter.dev/incarnation` on the records naming it): its container
    /// ending with this incarnation's termination message (reported by the kubelet) proves the
    /// term's work stopped. (Its withdrawal mark does not: anyone who may write candidates can
    /// write one.) The first one seen in the term
    /// counts: the agent that took a term never changes it, so a later value is an edit.
    incarnation: Option<String>,
    /// The pod that process took the term in (`arbiter.dev/taken-in-pod`), learned with
    /// the incarnation: `None` while no take was seen, `Some(None)` for a process outside a pod.
    taken_in: Option<Option<String>>,
    /// The term (`leaseTransitions`) this memory is of: an incarnation is learned only from a
    /// record of that term (a stale record of the term before must not lend it its process).
    term: i32,
}

/// The holder remembered when nothing names one, yet the term mark says a term may have been
/// handed out before this replica became active ([`crate::reconcile`]'s
/// `unknown_term`): not a candidate's name (no Kubernetes name has `<`), so no candidate is
/// taken for it, and its term is waited out like a reported leader's: a full duration from
/// the first look, as long as the longest any of the lease's candidates declares.
pub const UNKNOWN_HOLDER: &str = "<unknown>";

/// A holder presumed to run when a replica first looks at a lease and nothing names one: the
/// unknown holder of a term the term mark says may have been handed out.
#[derive(Clone, Debug)]
pub struct Presumed {
    pub name: String,
    pub pod_uid: Option<String>,
    /// The lease duration its agent declares (zero if none).
    pub declared: Duration,
}

/// The Lease as the arbiter sees it now, for [`Held::learn`].
pub struct Seen<'a> {
    pub holder: Option<&'a str>,
    /// When the current record was first seen.
    pub since: Instant,
    pub duration: Duration,
    pub pod_uid: Option<&'a str>,
    /// `arbiter.dev/released-by` when the Lease has no holder.
    pub released_by: Option<&'a str>,
    /// The holder's incarnation recorded on the Lease (by arbiter's field manager).
    pub incarnation: Option<&'a str>,
    /// The pod the holder's agent took the term in, as it recorded it with its incarnation.
    pub taken_in: Option<&'a str>,
    /// The Lease's term (`leaseTransitions`).
    pub term: i32,
}

/// The memory of every lease's holder. Shared: the workers learn and assign, and the Lease
/// watch bumps a term's last sighting as it delivers the holder's records
/// ([`Held::renewed`]), before any worker looks.
#[derive(Clone, Default)]
pub struct Held {
    terms: Arc<Mutex<HashMap<LeaseKey, Term>>>,
}

impl Held {
    fn locked(&self) -> MutexGuard<'_, HashMap<LeaseKey, Term>> {
        // A panic while holding it leaves plain data; the map is still usable.
        self.terms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A record naming `holder` was first delivered at `since`: if the remembered term is
    /// `holder`'s, it was last seen no earlier than then. Only ever lengthens a term (what a
    /// reconcile of that record would do, see [`Held::learn`]); learns no new term. Called by
    /// the Lease watch for every record it delivers, so a renewal no worker has reconciled
    /// yet still counts if the Lease is then deleted or edited by hand.
    pub fn renewed(&self, key: &LeaseKey, holder: &str, since: Instant) {
        if let Some(t) = self.locked().get_mut(key)
            && t.holder == holder
        {
            t.last_seen = t.last_seen.max(since);
        }
    }

    /// Learns from the Lease as seen now (`None`: the Lease does not exist). `presumed` is the
    /// holder presumed to run, for when nothing else is known. `stopped` says whether a pod uid is confirmed stopped.
    pub fn learn(
        &self,
        key: &LeaseKey,
        lease: Option<&Seen>,
        presumed: Option<&Presumed>,
        fallback_duration: Duration,
        now: Instant,
        stopped: impl Fn(&str) -> bool,
    ) {
        let mut terms = self.locked();
        let current = terms.get(key);
        let known = current.is_some();
        let over = current.is_none_or(|t| over(t, lease, now, &stopped));
        let remember_presumed = |terms: &mut HashMap<LeaseKey, Term>, leader: &Presumed| {
            let term = Term {
                holder: leader.name.clone(),
                last_seen: now,
                duration: fallback_duration.max(leader.declared),
                pod_uid: leader.pod_uid.clone(),
                incarnation: None,
                taken_in: None,
                term: 0,
            };
            terms.insert(key.clone(), term);
        };
        // First look since this process started, and the Lease names someone other than the
        // holder presumed to run (an edit made before, or during, a failover): the presumed
        // holder may still run; its term comes first.
        if let (false, Some(l), Some(leader)) = (known, lease, presumed)
            && l.holder.is_some_and(|h| h != leader.name)
        {
            remember_presumed(&mut terms, leader);
            return;
        }
        match (lease, lease.and_then(|l| l.holder)) {
            (Some(l), Some(h)) => match terms.get_mut(key) {
                // The same holder at a later term (reassigned to it by another replica while
                // this one did not look, or a term this memory did not know: a presumed holder's): that term, from its record, waited out at least as long.
                Some(t) if t.holder == h && l.term > t.term => {
                    *t =
                        Term::of_record(l, h, t.last_seen.max(l.since), t.duration.max(l.duration));
                }
                Some(t) if t.holder == h => {
                    t.last_seen = t.last_seen.max(l.since);
                    t.duration = t.duration.max(l.duration);
                    if let (None, Some(i), true) = (&t.incarnation, l.incarnation, l.term == t.term)
                    {
                        t.incarnation = Some(i.to_string());
                        t.taken_in = Some(l.taken_in.map(str::to_string));
                    }
                }
                // Named by someone other than the arbiter while the last term may still run:
                // keep remembering that term.
                Some(_) if !over => {}
                _ => {
                    // First seen by this process (after a start or a failover), the record
                    // may already have been edited: a full duration at least, from now.
                    let duration = if known {
                        l.duration
                    } else {
                        l.duration.max(fallback_duration)
                    };
                    terms.insert(key.clone(), Term::of_record(l, h, l.since, duration));
                }
            },
            // Nothing known since this process started, and no Lease, or one without a holder
            // that its holder did not release: the presumed holder may still run; give it a
            // full duration from now.
            (_, None) if !known && lease.is_none_or(|l| l.released_by.is_none()) => {
                if let Some(leader) = presumed {
                    remember_presumed(&mut terms, leader);
                }
            }
            _ => {}
        }
    }

    /// The Lease's watch was down and writes were missed (the relist shows another version, or
    /// no Lease): whatever holder is remembered may have renewed until `at`. Only ever
    /// lengthens a term.
    pub fn seen_in_gap(&self, key: &LeaseKey, at: Instant) {
        if let Some(t) = self.locked().get_mut(key) {
            t.last_seen = t.last_seen.max(at);
        }
    }

    /// Records the arbiter's own assignment of `holder` at `term`.
    pub fn assigned(
        &self,
        key: &LeaseKey,
        holder: &str,
        term: i32,
        duration: Duration,
        pod_uid: Option<&str>,
        now: Instant,
    ) {
        let term = Term {
            holder: holder.to_string(),
            last_seen: now,
            duration,
            pod_uid: pod_uid.map(str::to_string),
            incarnation: None,
            taken_in: None,
            term,
        };
        self.locked().insert(key.clone(), term);
    }

    /// The remembered holder, for the election.
    pub fn previous(
        &self,
        key: &LeaseKey,
        now: Instant,
        stopped: impl Fn(&str) -> bool,
    ) -> Option<Previous> {
        let terms = self.locked();
        let t = terms.get(key)?;
        Some(Previous {
            holder: t.holder.clone(),
            quiet_for: now.saturating_duration_since(t.last_seen),
            duration: t.duration,
            pod_stopped: t.stop_proof(false).is_some_and(&stopped),
        })
    }

    /// Whether anything is remembered of `key`'s holder.
    pub fn knows(&self, key: &LeaseKey) -> bool {
        self.locked().contains_key(key)
    }

    /// The remembered holder and its incarnation, when the Lease recorded one for its term.
    pub fn incarnation(&self, key: &LeaseKey) -> Option<(String, String)> {
        let terms = self.locked();
        let t = terms.get(key)?;
        Some((t.holder.clone(), t.incarnation.clone()?))
    }

    /// The longest duration, and the recorded pod uid, of `holder`'s term, if it is the one
    /// remembered.
    pub fn term_of(&self, key: &LeaseKey, holder: &str) -> Option<(Duration, Option<String>)> {
        self.locked()
            .get(key)
            .filter(|t| t.holder == holder)
            .map(|t| (t.duration, t.pod_uid.clone()))
    }

    /// The pod `holder`'s remembered term was taken in, if that is the pod recorded at its
    /// assignment (a take was seen, in that pod): the only pod whose container's end can prove
    /// the term's process gone. (A candidate's owner can be re-pointed at any pod.)
    pub fn taken_in_recorded_pod(&self, key: &LeaseKey, holder: &str) -> Option<String> {
        self.locked()
            .get(key)
            .filter(|t| t.holder == holder)
            .and_then(|t| t.stop_proof(false).map(str::to_string))
    }

    /// The pod whose confirmed stop ends `holder`'s term, if it is the one remembered, judged
    /// against the Lease that names it now at `term` (see [`Term::stop_proof`]; a record of
    /// another term proves nothing about the remembered one).
    pub fn ended_by_stop_of(&self, key: &LeaseKey, holder: &str, term: i32) -> Option<String> {
        self.locked()
            .get(key)
            .filter(|t| t.holder == holder && t.term == term)
            .and_then(|t| t.stop_proof(true).map(str::to_string))
    }
}

impl Term {
    /// `holder`'s term as record `l` shows it (its pod, and its take if the record has one),
    /// last seen at `last_seen`, waited out for `duration`.
    fn of_record(l: &Seen, holder: &str, last_seen: Instant, duration: Duration) -> Term {
        Term {
            holder: holder.to_string(),
            last_seen,
            duration,
            pod_uid: l.pod_uid.map(str::to_string),
            incarnation: l.incarnation.map(str::to_string),
            taken_in: l.incarnation.map(|_| l.taken_in.map(str::to_string)),
            term: l.term,
        }
    }

    /// The pod whose confirmed stop ends this term ([`arbiter_election::proof::stop_proof`]).
    fn stop_proof(&self, with_lease: bool) -> Option<&str> {
        arbiter_election::proof::stop_proof(
            self.pod_uid.as_deref(),
            self.taken_in.as_ref().map(Option::as_deref),
            with_lease,
        )
    }
}

/// Whether a remembered term is certainly over.
fn over(t: &Term, lease: Option<&Seen>, now: Instant, stopped: &impl Fn(&str) -> bool) -> bool {
    let released_itself =
        lease.is_some_and(|l| l.holder.is_none() && l.released_by == Some(t.holder.as_str()));
    released_itself
        || t.stop_proof(false).is_some_and(stopped)
        || now.saturating_duration_since(t.last_seen) >= t.duration
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LeaseKey {
        LeaseKey {
            namespace: "ns".into(),
            name: "l".into(),
        }
    }

    const D: Duration = Duration::from_secs(15);

    fn leader(name: &str) -> Presumed {
        Presumed {
            name: name.into(),
            pod_uid: None,
            declared: Duration::ZERO,
        }
    }

    #[test]
    fn after_a_failover_the_reported_leader_comes_before_a_holder_named_by_hand() {
        let t0 = Instant::now();
        let held = Held::default();
        // The Lease names b (set by hand, with b's stopped pod); a was reported leader and
        // declares a 60 s lease.
        let hand = Seen {
            pod_uid: Some("uid-b"),
            ..seen(Some("b"), t0, D)
        };
        let a = Presumed {
            declared: Duration::from_secs(60),
            ..leader("a")
        };
        held.learn(&key(), Some(&hand), Some(&a), D, t0, |uid| uid == "uid-b");
        let p = held.previous(&key(), t0, |uid| uid == "uid-b").unwrap();
        assert_eq!(
            (p.holder.as_str(), p.duration, p.pod_stopped),
            ("a", Duration::from_secs(60), false)
        );
        // The reported leader named by the Lease: the Lease's record is learned as usual.
        let same = Held::default();
        same.learn(
            &key(),
            Some(&seen(Some("a"), t0, D)),
            Some(&leader("a")),
            D,
            t0,
            |_| false,
        );
        assert_eq!(same.previous(&key(), t0, |_| false).unwrap().holder, "a");
    }

    fn seen(holder: Option<&str>, since: Instant, duration: Duration) -> Seen<'_> {
        Seen {
            holder,
            since,
            duration,
            pod_uid: None,
            released_by: None,
            incarnation: None,
            taken_in: None,
            term: 1,
        }
    }

    /// The same holder at a later term (given to it by another replica while this one did not
    /// look, a node drain moving it to a new pod): that term's record counts, its pod and its
    /// take; the earlier term's pod stopping proves nothing about it.
    #[test]
    fn a_later_term_of_the_same_holder_replaces_the_remembered_one() {
        let t0 = Instant::now();
        let record = |term, pod, incarnation, taken_in| Seen {
            pod_uid: Some(pod),
            incarnation: Some(incarnation),
            taken_in: Some(taken_in),
            term,
            ..seen(Some("a"), t0, D)
        };
        let held = Held::default();
        let uid0_stopped = |uid: &str| uid == "uid-0";
        held.learn(
            &key(),
            Some(&record(1, "uid-0", "a1", "uid-0")),
            None,
            D,
            t0,
            uid0_stopped,
        );
        assert_eq!(
            held.ended_by_stop_of(&key(), "a", 1).as_deref(),
            Some("uid-0")
        );
        held.learn(
            &key(),
            Some(&record(2, "uid-1", "a2", "uid-1")),
            None,
            D,
            t0,
            uid0_stopped,
        );
        assert_eq!(
            held.ended_by_stop_of(&key(), "a", 2).as_deref(),
            Some("uid-1")
        );
        assert_eq!(
            held.ended_by_stop_of(&key(), "a", 1),
            None,
            "a record of another term"
        );
        assert!(!held.previous(&key(), t0, uid0_stopped).unwrap().pod_stopped);
        assert_eq!(held.incarnation(&key()), Some(("a".into(), "a2".into())));
    }

    /// The pod recorded at assignment ends the term only if the term was taken in it: a new
    /// pod of the same name (a StatefulSet pod created again) that took the term is not ended
    /// by the old pod's stop. While no take was seen, the recorded pod's stop counts against a
    /// Lease that names the holder (a take not seen yet makes the deposing write conflict),
    /// not when the Lease is gone.
    #[test]
    fn a_recorded_pod_ends_only_a_term_taken_in_it() {
        let t0 = Instant::now();
        let old_stopped = |uid: &str| uid == "uid-old";
        let taken = |held: &Held, taken_in: Option<&'static str>| {
            let record = Seen {
                incarnation: Some("a2"),
                taken_in,
                ..seen(Some("a"), t0, D)
            };
            held.learn(&key(), Some(&record), None, D, t0, old_stopped);
        };
        let proof = |held: &Held| held.ended_by_stop_of(&key(), "a", 1);
        let previous = |held: &Held| held.previous(&key(), t0, old_stopped).unwrap().pod_stopped;
        // Whose container's end can prove the process gone: only a pod the take was seen in.
        let container = |held: &Held| held.taken_in_recorded_pod(&key(), "a");

        // Assigned in the old pod, not taken yet.
        let held = Held::default();
        held.assigned(&key(), "a", 1, D, Some("uid-old"), t0);
        assert_eq!(proof(&held).as_deref(), Some("uid-old"));
        assert_eq!(container(&held), None, "no take seen");
        assert!(
            !previous(&held),
            "with the Lease gone, an unseen take is waited out"
        );

        // Taken in the new pod.
        taken(&held, Some("uid-new"));
        assert_eq!(proof(&held), None);
        assert!(!previous(&held));
        assert_eq!(
            container(&held),
            None,
            "the recorded pod never ran the term"
        );

        // Taken in the recorded pod.
        let held = Held::default();
        held.assigned(&key(), "a", 1, D, Some("uid-old"), t0);
        taken(&held, Some("uid-old"));
        assert_eq!(proof(&held).as_deref(), Some("uid-old"));
        assert!(previous(&held));
        assert_eq!(container(&held).as_deref(), Some("uid-old"));

        // Taken outside any pod (or by an agent that does not say where).
        let held = Held::default();
        held.assigned(&key(), "a", 1, D, Some("uid-old"), t0);
        taken(&held, None);
        assert_eq!(proof(&held), None);
    }

    #[test]
    fn the_terms_incarnation_is_learned_once_from_a_record_of_that_term() {
        let t0 = Instant::now();
        let held = Held::default();
        let none = |_: &str| false;
        held.assigned(&key(), "a", 2, D, Some("uid-a"), t0);
        // A stale record of term 1 (the same holder, run by its earlier process) lends nothing.
        let stale = Seen {
            incarnation: Some("a1"),
            ..seen(Some("a"), t0, D)
        };
        held.learn(&key(), Some(&stale), None, D, t0, none);
        assert_eq!(held.incarnation(&key()), None);
        // The agent's renew of term 2 records its process.
        let renewed = Seen {
            incarnation: Some("a2"),
            term: 2,
            ..seen(Some("a"), t0, D)
        };
        held.learn(&key(), Some(&renewed), None, D, t0, none);
        assert_eq!(held.incarnation(&key()), Some(("a".into(), "a2".into())));
        // Another value later in the term is an edit: not believed.
        let edited = Seen {
            incarnation: Some("a1"),
            term: 2,
            ..seen(Some("a"), t0, D)
        };
        held.learn(&key(), Some(&edited), None, D, t0, none);
        assert_eq!(held.incarnation(&key()), Some(("a".into(), "a2".into())));
    }

    #[test]
    fn a_hand_edit_neither_replaces_nor_shortens_the_remembered_term() {
        let t0 = Instant::now();
        let held = Held::default();
        let none = |_: &str| false;
        held.assigned(&key(), "a", 1, D, Some("uid-a"), t0);
        // a renews (a new record, first seen at t0 + 5 s) and writes a 20 s duration.
        let renewed = seen(
            Some("a"),
            t0 + Duration::from_secs(5),
            Duration::from_secs(20),
        );
        held.learn(
            &key(),
            Some(&renewed),
            None,
            D,
            t0 + Duration::from_secs(5),
            none,
        );
        // Someone lowers the duration to 1 s by hand, then names b by hand.
        let lowered = seen(
            Some("a"),
            t0 + Duration::from_secs(6),
            Duration::from_secs(1),
        );
        held.learn(
            &key(),
            Some(&lowered),
            None,
            D,
            t0 + Duration::from_secs(6),
            none,
        );
        let hand = seen(Some("b"), t0 + Duration::from_secs(7), D);
        held.learn(
            &key(),
            Some(&hand),
            None,
            D,
            t0 + Duration::from_secs(7),
            none,
        );
        let p = held
            .previous(&key(), t0 + Duration::from_secs(8), none)
            .unwrap();
        assert_eq!(p.holder, "a");
        assert_eq!(
            p.duration,
            Duration::from_secs(20),
            "the longest duration counts"
        );
        assert_eq!(p.quiet_for, Duration::from_secs(2), "from a's last record");
        // Once a's term is over on this clock, the Lease's holder is learned.
        let later = t0 + Duration::from_secs(27);
        let hand = seen(Some("b"), t0 + Duration::from_secs(7), D);
        held.learn(&key(), Some(&hand), None, D, later, none);
        assert_eq!(held.previous(&key(), later, none).unwrap().holder, "b");
    }

    #[test]
    fn the_recorded_pod_is_what_proves_a_stop_not_the_annotation() {
        let t0 = Instant::now();
        let held = Held::default();
        held.assigned(&key(), "a", 1, D, Some("uid-a"), t0);
        // Taken in its pod, and the record's pod annotation rewritten.
        let forged = Seen {
            pod_uid: Some("uid-dead"),
            incarnation: Some("a1"),
            taken_in: Some("uid-a"),
            ..seen(Some("a"), t0, D)
        };
        let stopped = |uid: &str| uid == "uid-dead";
        held.learn(&key(), Some(&forged), None, D, t0, stopped);
        assert!(!held.previous(&key(), t0, stopped).unwrap().pod_stopped);
        assert!(
            held.previous(&key(), t0, |u| u == "uid-a")
                .unwrap()
                .pod_stopped
        );
    }

    #[test]
    fn without_memory_a_missing_lease_waits_a_full_duration_for_the_last_reported_leader() {
        let t0 = Instant::now();
        let held = Held::default();
        held.learn(&key(), None, Some(&leader("a")), D, t0, |_| false);
        let p = held
            .previous(&key(), t0 + Duration::from_secs(3), |_| false)
            .unwrap();
        assert_eq!(
            (p.holder.as_str(), p.quiet_for, p.duration),
            ("a", Duration::from_secs(3), D)
        );
        // The fallback is taken once: it does not restart the wait on every look.
        held.learn(
            &key(),
            None,
            Some(&leader("a")),
            D,
            t0 + Duration::from_secs(9),
            |_| false,
        );
        let p = held
            .previous(&key(), t0 + Duration::from_secs(9), |_| false)
            .unwrap();
        assert_eq!(p.quiet_for, Duration::from_secs(9));
    }

    #[test]
    fn after_a_failover_an_unreleased_empty_lease_waits_for_the_last_reported_leader() {
        let t0 = Instant::now();
        let held = Held::default();
        let cleared = seen(None, t0, Duration::from_secs(1));
        held.learn(&key(), Some(&cleared), Some(&leader("a")), D, t0, |_| false);
        let p = held.previous(&key(), t0, |_| false).unwrap();
        assert_eq!((p.holder.as_str(), p.duration), ("a", D));
        // Released by the holder itself: nothing to wait for.
        let other = Held::default();
        let released = Seen {
            released_by: Some("a"),
            ..seen(None, t0, D)
        };
        other.learn(&key(), Some(&released), Some(&leader("a")), D, t0, |_| {
            false
        });
        assert!(other.previous(&key(), t0, |_| false).is_none());
        // A holder first seen with a lowered duration still gets the arbiter's full one.
        let third = Held::default();
        let lowered = seen(Some("a"), t0, Duration::from_secs(1));
        third.learn(&key(), Some(&lowered), None, D, t0, |_| false);
        assert_eq!(third.previous(&key(), t0, |_| false).unwrap().duration, D);
    }

    #[test]
    fn the_holders_own_release_ends_the_term() {
        let t0 = Instant::now();
        let held = Held::default();
        held.assigned(&key(), "a", 1, D, None, t0);
        let released = Seen {
            released_by: Some("a"),
            ..seen(None, t0, D)
        };
        assert!(over(&held.locked()[&key()], Some(&released), t0, &|_| {
            false
        }));
        let cleared = seen(None, t0, D);
        assert!(!over(&held.locked()[&key()], Some(&cleared), t0, &|_| {
            false
        }));
    }
}
