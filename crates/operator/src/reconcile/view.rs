//! What the election sees of a lease: the Lease as it stands, read against what this process
//! remembers of its holder (no hand edit of the Lease shortens a term), the term remembered
//! when the Lease is gone, and whether the holder's process or pod is over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use super::lease_memory::LeaseMemory;
use crate::Settings;
use crate::cache::{Caches, lease_records, pod_facts};
use crate::key::LeaseKey;
use crate::reconcile::{Worker, declared_duration};
use crate::term::held;
use arbiter_api::LeaseCandidate;
use arbiter_api::lease::{self, HOLDER_POD_ANNOTATION};
use arbiter_election::decide;

/// The lease as the election sees it.
pub(crate) struct View {
    /// The Lease's view (`None`: there is no Lease).
    pub lease: Option<decide::Lease>,
    /// The term remembered while the Lease is gone or names nobody.
    pub previous: Option<decide::Previous>,
    /// Why the holder's term ended, for the leader-change metric if a new one is assigned:
    /// `released`, `pod_stopped`, `container_restarted`, `expired`, or `new`.
    pub term_ended: &'static str,
}

/// The reading of a lease's Lease, as a value: the caches and settings it reads, and the
/// worker's memory of the Lease it keeps (when it first saw each record and term), borrowed
/// from the worker for the call.
pub(crate) struct Viewer<'w> {
    caches: &'w Caches,
    settings: &'w Settings,
    leases: &'w mut LeaseMemory,
}

impl Worker {
    /// The Lease's reader, over this worker's memory.
    pub(crate) fn viewer(&mut self) -> Viewer<'_> {
        Viewer {
            caches: &self.caches,
            settings: &self.settings,
            leases: &mut self.leases,
        }
    }
}

impl Viewer<'_> {
    /// How long the Lease record has been unchanged, on this process's monotonic clock (since
    /// the watch delivered it: [`crate::cache::lease_records`]).
    /// Also how long this process has known the Lease's current term (its holder and
    /// `leaseTransitions`): a lower bound of the term's age, on this process's clock.
    fn record_age(&mut self, key: &LeaseKey, lease: &Lease) -> (Duration, Duration) {
        let fingerprint = lease_records::fingerprint(lease);
        let holder = lease::holder(lease).map(str::to_string);
        let delivered = self.caches.records.since(key, &fingerprint);
        self.leases
            .sighted(key, fingerprint, holder, lease::term(lease), delivered)
    }

    /// Whether the pod the lease's holder ran in (recorded at assignment, by arbiter: a uid
    /// written by hand proves nothing) is confirmed stopped, and the term, if an agent took it,
    /// was taken in that pod.
    fn holder_pod_stopped(&self, l: &Lease) -> bool {
        let recorded = l
            .annotations()
            .get(HOLDER_POD_ANNOTATION)
            .filter(|_| arbiter_api::written_by_arbiter(&l.metadata, HOLDER_POD_ANNOTATION))
            .map(String::as_str);
        let taken = lease::agent_incarnation(l).map(|_| lease::taken_in_pod(l));
        let Some(uid) = arbiter_election::proof::stop_proof(recorded, taken, true) else {
            return false;
        };
        let ns = l.namespace().unwrap_or_default();
        self.caches.stopped_pods.contains(&ns, uid)
    }

    /// Builds the view of `key`'s lease, and marks in `inputs` a holder candidate whose process
    /// ended (not elected again until a new process of it registers). `unknown_term`: see
    /// [`super::gather::Pass::unknown_term`].
    pub(crate) fn view(
        &mut self,
        key: &LeaseKey,
        lease: Option<&Lease>,
        candidates: &[Arc<LeaseCandidate>],
        unknown_term: bool,
        inputs: &mut [decide::Candidate],
    ) -> View {
        let now = Instant::now();
        let wall = jiff::Timestamp::now();
        let mut term_known_for = Duration::ZERO;
        let observed = lease.map(|l| {
            let (unchanged_for, term_age) = self.record_age(key, l);
            term_known_for = term_age;
            (l, unchanged_for)
        });
        // The holder's own candidate may lengthen its term (the lease duration its agent
        // writes), never shorten it: the pod its `ownerReferences` name now is whatever its
        // writer put there, not the pod that took the term.
        let holder_candidate = observed
            .and_then(|(l, _)| lease::holder(l))
            .and_then(|h| candidates.iter().find(|c| c.name_any() == h));
        // What this process remembers of the holder: no edit of the Lease shortens a term.
        let seen = observed.map(|(l, unchanged_for)| {
            self.record_seen(l, now - unchanged_for, declared_duration(holder_candidate))
        });
        // On a first look (after a start or a failover), whatever the Lease says may have been
        // edited before this process saw it (its holder replaced, its duration lowered): the
        // term first seen runs as long as any of the lease's candidates says its terms last,
        // and never less than the arbiter's own lease duration. With nothing that names a
        // holder, but a term mark that says a term may have been handed out before this
        // replica became active, an unknown holder's term, as long.
        let longest = candidates
            .iter()
            .map(|c| declared_duration(Some(c)))
            .max()
            .unwrap_or_default()
            .max(self.settings.lease_duration);
        let leader = unknown_term.then(|| held::Presumed {
            name: held::UNKNOWN_HOLDER.into(),
            pod_uid: None,
            declared: longest,
        });
        let stopped = |uid: &str| self.caches.stopped_pods.contains(&key.namespace, uid);
        let held = &self.caches.held;
        held.learn(key, seen.as_ref(), leader.as_ref(), longest, now, stopped);
        let previous = held.previous(key, now, stopped);
        let ended = self.ended_process(key, observed.map(|(l, _)| l), holder_candidate);
        // Its candidate is not elected again until a new process of it registers (the last
        // acknowledgements came from the dead one).
        if let (Some(dead), Some(c)) = (&ended, holder_candidate)
            && arbiter_api::incarnation(c) == Some(dead.as_str())
            && let Some(i) = candidates.iter().position(|x| x.name_any() == c.name_any())
        {
            inputs[i].pod = decide::PodState::Stopped;
        }
        let term_seen = arbiter_election::heard::own_clock(
            now.checked_sub(term_known_for).unwrap_or(now),
            now,
            wall,
        );
        let observed_view = observed.map(|(l, unchanged_for)| {
            self.lease_view(key, l, unchanged_for, ended.is_some(), term_seen)
        });
        let term_ended = term_ended(observed_view.as_ref().and_then(|(_, by)| *by), &previous);
        View {
            lease: observed_view.map(|(view, _)| view),
            previous,
            term_ended,
        }
    }

    /// A Lease record as the memory of holders takes it: first seen `since`, its duration at
    /// least the holder's `declared` one, and the pod and incarnation only as arbiter and the
    /// agents wrote them (not a hand edit).
    fn record_seen<'l>(&self, l: &'l Lease, since: Instant, declared: Duration) -> held::Seen<'l> {
        held::Seen {
            holder: lease::holder(l),
            since,
            duration: lease::duration(l)
                .unwrap_or(self.settings.lease_duration)
                .max(declared),
            // As the arbiter recorded it at assignment (its field manager), not a hand edit.
            pod_uid: l
                .annotations()
                .get(HOLDER_POD_ANNOTATION)
                .map(String::as_str)
                .filter(|_| arbiter_api::written_by_arbiter(&l.metadata, HOLDER_POD_ANNOTATION)),
            released_by: lease::released_by(l),
            incarnation: lease::agent_incarnation(l),
            taken_in: lease::taken_in_pod(l),
            term: lease::term(l),
        }
    }

    /// The incarnation that took the holder's term (as remembered: learned once per term, from
    /// a record an agent wrote), if it ended with its container: the kubelet reported the
    /// termination message it wrote, in the pod the term was assigned in.
    fn ended_process(
        &self,
        key: &LeaseKey,
        lease: Option<&Lease>,
        holder_candidate: Option<&Arc<LeaseCandidate>>,
    ) -> Option<String> {
        let held = &self.caches.held;
        let holder = lease.and_then(lease::holder)?;
        let (h, incarnation) = held.incarnation(key)?;
        // Only the pod the term was seen taken in, and recorded at its assignment: a
        // candidate's owner reference can be pointed at a pod that never ran the term.
        let recorded = held.taken_in_recorded_pod(key, holder)?;
        let pod = holder_candidate.and_then(|c| pod_facts::pod_of(c, self.caches))?;
        (h == holder
            && pod.uid().as_deref() == Some(recorded.as_str())
            && crate::cache::pod_facts::incarnation_ended(&pod, &incarnation))
        .then_some(incarnation)
    }

    /// The Lease `l` as the election sees it, unchanged for `unchanged_for` on this process's
    /// clock, its term known since `term_seen`; and why its holder's term ended, for the
    /// leader-change metric if a new one is assigned (`None`: it names nobody and nobody
    /// released it).
    fn lease_view(
        &self,
        key: &LeaseKey,
        l: &Lease,
        unchanged_for: Duration,
        process_ended: bool,
        term_seen: jiff::Timestamp,
    ) -> (decide::Lease, Option<&'static str>) {
        let held = &self.caches.held;
        let stopped = |uid: &str| self.caches.stopped_pods.contains(&key.namespace, uid);
        let holder = lease::holder(l).map(str::to_string);
        // Not the arbiter's Lease: its holder's duration, and never less than the arbiter's
        // own (the Lease says what someone else wrote).
        let foreign = !lease::managed(l);
        let written = match lease::duration(l) {
            Some(d) if foreign => d.max(self.settings.lease_duration),
            Some(d) => d,
            None => self.settings.lease_duration,
        };
        // While the holder is the one remembered, its term's longest duration and its pod as
        // recorded at assignment count, not what the Lease says now.
        // The pod ends the term only if the term was taken in it (a new pod of the same name
        // may have taken it: `Held::ended_by_stop_of`).
        let (duration, pod_stopped) = match holder.as_deref().and_then(|h| held.term_of(key, h)) {
            Some((longest, _)) => {
                let uid = holder
                    .as_deref()
                    .and_then(|h| held.ended_by_stop_of(key, h, lease::term(l)));
                (longest.max(written), uid.is_some_and(|u| stopped(&u)))
            }
            None => (written, self.holder_pod_stopped(l)),
        };
        let released_by = lease::released_by(l);
        let ended_by = match () {
            _ if holder.is_none() => released_by.map(|_| "released"),
            _ if pod_stopped => Some("pod_stopped"),
            _ if process_ended => Some("container_restarted"),
            _ => Some("expired"),
        };
        let pod_stopped = pod_stopped || process_ended;
        let view = decide::Lease {
            holder,
            preferred_holder: lease::preferred_holder(l).map(str::to_string),
            strategy: lease::strategy(l).map(str::to_string),
            duration,
            unchanged_for,
            released_by: released_by.map(str::to_string),
            holder_pod_stopped: pod_stopped,
            term_seen: Some(term_seen),
            switchover: l
                .annotations()
                .get(lease::HANDOVER_REQUEST_ANNOTATION)
                .map(|v| lease::parse_handover_request(v)),
            term: lease::term(l),
            foreign,
        };
        (view, ended_by)
    }
}

/// Why the holder's term ended, for the leader-change metric: as the Lease's view says
/// (`by_lease`), else, with no Lease or one naming nobody, the term remembered ended (or there
/// was none: `new`).
fn term_ended(by_lease: Option<&'static str>, previous: &Option<decide::Previous>) -> &'static str {
    by_lease
        .or_else(|| {
            previous.as_ref().map(|p| {
                if p.pod_stopped {
                    "pod_stopped"
                } else {
                    "expired"
                }
            })
        })
        .unwrap_or("new")
}

/// When to look at a lease again even if nothing changes, after `action` on `lease`: just
/// after the holder's expiry, or after a wait. A holder whose lease has expired and whom
/// nothing replaced (nobody can be elected, or the lease is another strategy's) is looked at
/// again every second, not in a loop: what could change that arrives as an event.
pub(crate) fn look_again(
    action: &decide::Action,
    lease: Option<&decide::Lease>,
) -> Option<Duration> {
    use decide::Action;
    const JUST_AFTER: Duration = Duration::from_millis(100);
    match action {
        Action::Nothing | Action::WaitForRelease { .. } => lease
            .filter(|l| l.holder.is_some())
            .map(|l| match l.duration.checked_sub(l.unchanged_for) {
                Some(left) if !left.is_zero() => left + JUST_AFTER,
                _ => Duration::from_secs(1),
            }),
        Action::WaitForTerm { remaining, .. } | Action::WaitForForeign { remaining, .. } => {
            Some(*remaining + JUST_AFTER)
        }
        Action::Ping { .. } | Action::WaitForAcks => Some(Duration::from_millis(500)),
        Action::Settle { remaining } => Some(*remaining + JUST_AFTER),
        Action::StrategyConflict | Action::NoEligibleCandidate => Some(Duration::from_secs(5)),
        _ => Some(Duration::from_secs(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_for(unchanged_for: Duration) -> decide::Lease {
        decide::Lease {
            holder: Some("a".into()),
            preferred_holder: None,
            strategy: None,
            duration: 15 * S,
            unchanged_for,
            released_by: None,
            holder_pod_stopped: false,
            term_seen: None,
            switchover: None,
            term: 1,
            foreign: false,
        }
    }

    #[test]
    fn a_lease_is_looked_at_again_after_its_expiry_and_then_every_second() {
        use decide::Action;
        let ms = Duration::from_millis;
        let cases = [
            (
                Action::Nothing,
                Some(held_for(5 * S)),
                Some(10 * S + ms(100)),
            ),
            // Expired and nobody took it (nobody electable, another strategy's lease): every
            // second, not every 100 ms.
            (Action::Nothing, Some(held_for(15 * S)), Some(S)),
            (Action::Nothing, Some(held_for(40 * S)), Some(S)),
            (
                Action::WaitForRelease { to: "b".into() },
                Some(held_for(20 * S)),
                Some(S),
            ),
            // Nobody holds it: only events bring it back.
            (
                Action::Nothing,
                Some(decide::Lease {
                    holder: None,
                    ..held_for(S)
                }),
                None,
            ),
            (Action::Nothing, None, None),
            (Action::WaitForAcks, Some(held_for(S)), Some(ms(500))),
            (Action::NoEligibleCandidate, None, Some(5 * S)),
        ];
        for (action, lease, want) in cases {
            assert_eq!(
                look_again(&action, lease.as_ref()),
                want,
                "{action:?} on {lease:?}"
            );
        }
    }

    const S: Duration = Duration::from_secs(1);
}
