//! The next step for one lease, from what the arbiter currently knows.
//!
//! [`decide`] takes the lease's candidates, the Lease record (if any) and the arbiter's own
//! observations, and returns one [`Action`] plus the standing of every candidate (for status
//! conditions). It is the whole election policy:
//!
//! - Only an **eligible** candidate can be elected: its versions parse, its pod (if it has one)
//!   is running, it did not ignore the last ping, and it does not break the skew rule when
//!   skew is refused. Before electing, the arbiter **pings** (`spec.pingTime`) the eligible
//!   candidates whose liveness it does not know (one it saw renew on its own lately counts as
//!   alive: [`Candidate::renewed_lately`]), waits up to the ack window for them to write their
//!   `renewTime` after the ping (a change the arbiter observed, [`super::heard`]; never
//!   `renewTime >= pingTime`, which compares two hosts' clocks), and elects only among those
//!   that acknowledged. It stops waiting
//!   as soon as the best candidate that could still answer has answered: no later answer could
//!   change the outcome. So it asks only candidates that would outrank every one that
//!   answered, and the best of them alone: when it answers, nobody else is asked. Once a
//!   candidate of the lease has ignored a ping (it is Unresponsive), all of those are asked at
//!   once, so dead candidates cost an election one ack window more, not one each.
//! - A **live holder** (lease not expired on the arbiter's clock, holder not released, its pod
//!   not confirmed stopped) is never replaced directly. A better candidate gets it only through
//!   a **handover request** (`preferredHolder`), after which the holder releases, and only once
//!   it has answered a ping sent during the current term (after the arbiter first saw the
//!   term): an older answer
//!   may come from a process that has exited since, and the live holder would stop for nobody.
//!   It is asked only once no eligible candidate has registered for the settle time (at most
//!   an ack window after the target registered), and the target is pinged only then:
//!   candidates started together are counted while the holder works, so it hands over once, and
//!   its release goes to the target at once.
//!   After the release, the next holder must again have answered since the release was seen.
//! - **Candidates started together** register a moment apart: a lease's first election waits
//!   until no eligible candidate has registered for the settle time (at most an ack window from
//!   the first registration), so the oldest version leads from term 1. After a term ended the
//!   election waits only when everyone it could elect registered within the settle (the pool
//!   started again); otherwise it is at once, and an older candidate a moment behind is handed
//!   over to once the pool has settled.
//! - A **withdrawn** candidate (its agent stopped its work and left) is never elected.
//! - A **planned switchover** (`arbiter handover`) asks the live holder to hand over to a named
//!   candidate, or to the best other one, through the same handover request; it is refused
//!   unless that candidate is eligible and at the versions the rules would elect (the top
//!   emulation and binary versions among eligible candidates): a switchover may pick among
//!   equals, never put a newer version in charge while an older one runs.
//! - A lease that expired, was released, or whose holder's pod is confirmed stopped is
//!   **assigned** at once to the best acknowledged candidate. A holder whose term lapsed (it
//!   stopped renewing) is passed over while anyone else can lead; one that released it (and
//!   can still lead) only for a candidate at its versions or older, and among equals the
//!   handover's target (the preferred holder) goes first: it is the one asked, and waited for.
//!   After a lapse, a candidate is alive only by an answer to a ping sent during the lapsed
//!   term (the lapsed holder: since the lapse), not by an older answer or a renewal of its own.
//! - Under a **third-party strategy** the arbiter creates the Lease with that strategy and no
//!   holder, and never touches the holder. When the candidates go back to the arbiter's
//!   strategy, its next assignment writes that strategy on the Lease.
//! - A **strategy conflict** changes nothing; it is reported.
//! - A term ends only by the holder's own release, its pod confirmed stopped (or the container
//!   its process took the term in ended), or its lease expiring on the arbiter's clock. A **hand edit** does not end it: when the Lease is
//!   deleted, its holder cleared or replaced, or its duration lowered, the holder the arbiter
//!   last saw ([`Previous`]) keeps its full lease duration, counted from its last record the
//!   arbiter saw, before anyone else is elected.
//!
//! Expiry is `unchanged_for >= duration`, where `unchanged_for` is measured by the caller on its
//! monotonic clock since it first saw the current Lease record: no wall clock is trusted for it.
//! Every other time this module compares (pings sent and shown, terms seen, `now`) is a point
//! on the arbiter's own clock; no timestamp written by a candidate, another replica or a hand
//! edit is compared with anything.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

pub use super::heard::Ping;
use super::oldest_emulation::{self, Ranked};
use super::strategy::OLDEST_EMULATION_VERSION;
use super::strategy::{self, Resolution};
use super::{Version, VersionError};

/// What the arbiter knows of the pod a candidate belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    /// The candidate is not owned by a pod: its liveness alone counts.
    NoPod,
    /// The pod is running and not being deleted.
    Running,
    /// The pod exists but is pending, not ready or terminating: not electable, and its
    /// processes may still run.
    NotRunning,
    /// The pod reached a terminal phase, or was removed after its containers stopped: proof
    /// that its processes are gone.
    Stopped,
    /// The pod is not known (not yet seen, or force-deleted): not electable, and no proof.
    Missing,
    /// The pod runs, but the process that registered the candidate exited: the kubelet
    /// reported its container's end with that process's termination message. Not electable
    /// until a new process registers: a ping would wait out the ack window for nobody. (No
    /// proof that a term ended: only [`PodState::Stopped`] is.)
    ProcessExited,
}

impl PodState {
    fn electable(self) -> bool {
        matches!(self, PodState::NoPod | PodState::Running)
    }
}

/// A candidate as the arbiter sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub name: String,
    pub binary_version: String,
    pub emulation_version: Option<String>,
    pub strategy: String,
    pub created: Timestamp,
    /// The arbiter's own last ping to it and whether it answered ([`super::heard`]): points on
    /// the arbiter's own clock, never a timestamp the candidate or anyone else wrote.
    pub ping: Option<Ping>,
    /// The arbiter saw it renew on its own within the ack validity (judged by the caller on
    /// its own clocks: [`super::heard`]): alive without a ping, unless a ping it ignored says
    /// otherwise. Never enough where an answer to a ping sent after an event is required (a
    /// handover's target, the next holder after a release).
    pub renewed_lately: bool,
    pub pod: PodState,
    /// Its agent said it is gone (it stopped its workload and exited without being able to
    /// remove the candidate): never elected, until a new process of it registers.
    pub withdrawn: bool,
    /// When the arbiter saw it register (created, or a new process of it), on its own clock.
    pub registered: Option<Timestamp>,
}

impl Candidate {
    /// Whether it can lead at all: its process is there to lead (pod running, or no pod) and
    /// has not withdrawn.
    fn present(&self) -> bool {
        self.pod.electable() && !self.withdrawn
    }
}

/// The Lease record as last seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// `None` when there is no holder (`holderIdentity` unset or `""`).
    pub holder: Option<String>,
    pub preferred_holder: Option<String>,
    pub strategy: Option<String>,
    pub duration: Duration,
    /// How long the record has been unchanged, on the arbiter's monotonic clock, since the
    /// arbiter first saw it (after a restart: since the restart).
    pub unchanged_for: Duration,
    /// Who released the lease, when it has no holder because its holder stepped down.
    pub released_by: Option<String>,
    /// The holder's work is confirmed stopped: its pod stopped (known even after its candidate
    /// is gone), or the container its process ran in ended (the kubelet's report).
    pub holder_pod_stopped: bool,
    /// When the arbiter first saw (or made) the current holder's term, on its own clock: the
    /// term began no later. (Not `acquireTime`: another replica, or a hand edit, may have
    /// written that on another clock.)
    pub term_seen: Option<Timestamp>,
    /// A planned switchover someone asked for (`arbiter handover`).
    pub switchover: Option<Switchover>,
    /// The term (`leaseTransitions`).
    pub term: i32,
    /// The Lease was not made by the arbiter (no `arbiter.dev/managed` label): a client-go
    /// Lease kept when a workload moved under `arbiter run`, one made by hand. Its holder's
    /// term is someone else's, waited out before the arbiter takes the Lease over.
    pub foreign: bool,
}

/// A planned switchover (`arbiter handover LEASE [--to CANDIDATE]`): the live holder hands over
/// to `to`, or to the best other candidate, if the rules allow that candidate to lead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switchover {
    pub to: Option<String>,
    /// The holder and term the request was made for: once the lease has moved on, it no longer
    /// applies (it is refused, never carried out on a holder nobody named).
    pub holder: String,
    pub term: i32,
}

impl Lease {
    pub fn expired(&self) -> bool {
        self.unchanged_for >= self.duration
    }

    /// The holder whose term lapsed, and what an answer must have come after to prove a
    /// candidate alive now (on the clock `now` is read on).
    fn lapse(&self, now: Timestamp) -> Option<(&str, Lapse)> {
        let over_for = self.unchanged_for.checked_sub(self.duration)?;
        let lapsed = now
            .checked_sub(SignedDuration::try_from(over_for).ok()?)
            .ok()?;
        // The term was seen before it lapsed (a sighting after it would be a clock fault).
        let began = self.term_seen.filter(|a| *a <= lapsed).unwrap_or(lapsed);
        Some((self.holder.as_deref()?, Lapse { lapsed, began }))
    }
}

/// After a term lapsed, liveness counts only from answers to pings sent since: the lapsed
/// holder's since the lapse (its silence on the Lease is newer than any earlier answer or
/// renewal of its candidate), anyone else's since the term began. Without it, with an ack
/// validity longer than a lease, dead candidates would be given term after term on the
/// strength of old answers or registrations (a lone holder, or two taking turns), while a live
/// one waited.
#[derive(Clone, Copy)]
struct Lapse {
    lapsed: Timestamp,
    began: Timestamp,
}

/// The holder the arbiter last saw (or assigned) on this lease, remembered by the arbiter
/// itself, so that no edit of the Lease object can shorten its term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Previous {
    pub holder: String,
    /// Since the last Lease record naming it was first seen, on the arbiter's monotonic clock.
    pub quiet_for: Duration,
    /// The longest lease duration it was given or wrote during its term.
    pub duration: Duration,
    /// Its work is confirmed stopped: the pod the arbiter recorded for it at assignment
    /// stopped. (A withdrawal mark on its candidate is no proof: anyone who may write
    /// candidates can write one.)
    pub pod_stopped: bool,
}

/// Tunables of the election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    /// How long a pinged candidate has to acknowledge.
    pub ack_window: Duration,
    /// How long an acknowledgement counts as proof of life.
    pub ack_valid_for: Duration,
    /// How long an election with no live holder waits after the last registration.
    pub settle: Duration,
    /// The most minor versions a candidate's binaryVersion may be from the oldest live one.
    pub max_skew: Option<u64>,
    /// Refuse to elect candidates that break `max_skew` (otherwise they are only reported).
    pub refuse_skew: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            ack_window: Duration::from_secs(5),
            ack_valid_for: Duration::from_secs(10),
            settle: Duration::from_secs(2),
            max_skew: None,
            refuse_skew: false,
        }
    }
}

/// Whether a candidate answered the arbiter's last ping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Acknowledged a ping sent within `ack_valid_for`.
    Acked,
    /// Pinged within the ack window and not answered yet.
    Pending,
    /// Did not answer within the ack window. Not pinged again until it renews on its own.
    Unresponsive,
    /// Never pinged, or its last acknowledgement is too old.
    Unknown,
}

/// Where a candidate stands for this lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    Eligible(Liveness),
    Ineligible(Reason),
}

/// Why a candidate cannot be elected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    InvalidVersion(VersionError),
    /// The OldestEmulationVersion strategy governs the lease and this candidate has no
    /// emulationVersion.
    NoEmulationVersion,
    PodNotRunning(PodState),
    /// Its agent withdrew it on exiting.
    Withdrawn,
    Unresponsive,
    /// Its binaryVersion is too far from the oldest live one, and skew is refused.
    Skew(SkewViolation),
}

/// A live candidate whose binaryVersion is more than `max_skew` minor versions from the oldest
/// live candidate's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkewViolation {
    pub candidate: String,
    pub version: Version,
    pub oldest: Version,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing to change.
    Nothing,
    /// Create the Lease (term 1 when a holder is named).
    CreateLease {
        holder: Option<String>,
        strategy: String,
    },
    /// Name a new holder by compare-and-swap: term + 1, preferred holder cleared. `lapsed`
    /// names the previous holder when its term lapsed (it stopped renewing) rather than ended
    /// by release or confirmed death: its pod may need to be forced to stop.
    Assign {
        holder: String,
        lapsed: Option<String>,
    },
    /// Set `pingTime` on these candidates to learn whether they are alive.
    Ping { candidates: Vec<String> },
    /// Pings are outstanding; decide again when they are answered or the window ends.
    WaitForAcks,
    /// A candidate registered less than the settle time ago, and the election waits for the
    /// pool to settle (`gather`: a first election, or a pool started again; or a better
    /// candidate the live holder is to hand over to, before it is asked): decide again after
    /// `remaining`, so candidates started together are all counted.
    Settle { remaining: Duration },
    /// The Lease no longer names `holder` but nothing proves its term over (a hand edit): wait
    /// `remaining`, when its lease would have expired, before electing anyone.
    WaitForTerm { holder: String, remaining: Duration },
    /// The Lease is not the arbiter's ([`Lease::foreign`]) and its holder's term may still
    /// run: wait `remaining` (its duration unchanged on the arbiter's clock), then take it over.
    WaitForForeign { holder: String, remaining: Duration },
    /// Ask the live holder to hand over to `to` (set the preferred holder).
    RequestHandover { to: String },
    /// The handover to `to` was requested; wait for the holder to release (or expire).
    WaitForRelease { to: String },
    /// The preferred holder is stale (the holder is best again): clear it.
    ClearPreferredHolder,
    /// A planned switchover cannot be done: drop the request and say why.
    RefuseSwitchover { reason: String },
    /// Write the resolved third-party strategy on the Lease (never touching its holder).
    SetStrategy { strategy: String },
    /// Candidates disagree on the strategy: change nothing.
    StrategyConflict,
    /// An election is needed and nobody can be elected.
    NoEligibleCandidate,
    /// `holder` would be elected, but `pods` pods labelled for injection still run the lease's
    /// command unwrapped ([`held_for_unwrapped`]): nobody is given the lease until they are
    /// gone.
    WaitForUnwrapped { holder: String, pods: usize },
}

impl Action {
    /// The candidate this action gives the lease to: an assignment, or a Lease created with a
    /// holder.
    pub fn elects(&self) -> Option<&str> {
        match self {
            Action::Assign { holder, .. }
            | Action::CreateLease {
                holder: Some(holder),
                ..
            } => Some(holder),
            _ => None,
        }
    }

    /// Whether the lease's election is under way until someone is elected: pinging, waiting
    /// for answers, for the settle time or for a term to run out (each ends within an ack
    /// window or a lease duration), or electing now. Not a lease with nobody to elect: only a
    /// change can bring it a candidate.
    pub fn electing(&self) -> bool {
        self.elects().is_some()
            || matches!(
                self,
                Action::Ping { .. }
                    | Action::WaitForAcks
                    | Action::Settle { .. }
                    | Action::WaitForTerm { .. }
                    | Action::WaitForForeign { .. }
            )
    }
}

/// The decision for one lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    pub strategy: Resolution,
    /// Every candidate's standing, by name.
    pub standings: BTreeMap<String, Standing>,
    /// Reported whether or not skew is refused.
    pub skew_violations: Vec<SkewViolation>,
}

/// A candidate's liveness at `now` (on the arbiter's own clock), judged from the arbiter's own
/// last ping: answered, it proves life for the ack validity from when it was sent; unanswered,
/// it is pending for the ack window from when the arbiter's watch showed it (the answer comes
/// through the same watch), or, while the watch has not shown it, for the ack validity from when
/// it was sent. A candidate that renewed on its own lately ([`Candidate::renewed_lately`]) and
/// whose liveness would otherwise be unknown counts as having answered.
pub fn liveness(candidate: &Candidate, now: Timestamp, rules: &Rules) -> Liveness {
    let age = |at: Timestamp| Duration::try_from(now.duration_since(at)).unwrap_or(Duration::ZERO);
    let from_ping = match candidate.ping {
        None => Liveness::Unknown,
        Some(p) if p.answered && age(p.sent) <= rules.ack_valid_for => Liveness::Acked,
        Some(p) if p.answered => Liveness::Unknown,
        Some(Ping {
            shown: Some(shown), ..
        }) if age(shown) < rules.ack_window => Liveness::Pending,
        Some(Ping {
            shown: None, sent, ..
        }) if age(sent) < rules.ack_valid_for => Liveness::Pending,
        Some(_) => Liveness::Unresponsive,
    };
    match from_ping {
        Liveness::Unknown if candidate.renewed_lately => Liveness::Acked,
        l => l,
    }
}

/// While a term runs, its holder is judged by the term, not by the process or pod its
/// candidate names now: a holder whose registered process exited ([`PodState::ProcessExited`]),
/// or whose candidate names a pod that stopped or is unknown (its `ownerReferences` re-pointed,
/// by hand or by a replacement pod of the same name), stays electable; only the caller's proof
/// that what took the term ended ([`Lease::holder_pod_stopped`]) ends it. Without this, a newer
/// candidate would be asked to take over from a live holder. Once the term is over (lapsed, or
/// proven stopped) it is a candidate like any other. `None`: nothing to change.
fn holder_judged_by_its_term(
    candidates: &[Candidate],
    lease: Option<&Lease>,
) -> Option<Vec<Candidate>> {
    let holder = lease
        .filter(|l| !l.expired() && !l.holder_pod_stopped)?
        .holder
        .as_deref()?;
    let exited = |c: &Candidate| {
        c.name == holder
            && matches!(
                c.pod,
                PodState::ProcessExited | PodState::Stopped | PodState::Missing
            )
    };
    candidates.iter().any(exited).then(|| {
        candidates
            .iter()
            .map(|c| Candidate {
                pod: if exited(c) { PodState::Running } else { c.pod },
                ..c.clone()
            })
            .collect()
    })
}

struct Parsed<'a> {
    candidate: &'a Candidate,
    binary: Result<Version, VersionError>,
    emulation: Option<Result<Version, VersionError>>,
    liveness: Liveness,
}

/// Decides the next action for one lease. `candidates` are those naming this lease in its
/// namespace; their order does not matter. `previous` is the holder the arbiter itself last
/// saw on the lease, if any.
pub fn decide(
    candidates: &[Candidate],
    lease: Option<&Lease>,
    previous: Option<&Previous>,
    now: Timestamp,
    rules: &Rules,
) -> Decision {
    let adjusted;
    let candidates = match holder_judged_by_its_term(candidates, lease) {
        Some(c) => {
            adjusted = c;
            &adjusted[..]
        }
        None => candidates,
    };
    let lapse = lease.and_then(|l| l.lapse(now));
    let parsed: Vec<Parsed> = candidates
        .iter()
        .map(|c| Parsed {
            candidate: c,
            binary: Version::parse(&c.binary_version),
            emulation: c
                .emulation_version
                .as_deref()
                .map(|e| emulation_of(e, &c.binary_version)),
            liveness: match liveness(c, now, rules) {
                Liveness::Acked
                    if lapse.is_some_and(|(holder, since)| {
                        let since = if holder == c.name {
                            since.lapsed
                        } else {
                            since.began
                        };
                        c.ping.is_none_or(|p| p.sent < since)
                    }) =>
                {
                    Liveness::Unknown
                }
                l => l,
            },
        })
        .collect();

    // Candidates whose pods are gone or not running do not get a say in the strategy.
    let resolution = strategy::resolve(parsed.iter().filter(|p| p.candidate.present()).map(|p| {
        (
            p.candidate.name.as_str(),
            p.binary.as_ref().ok(),
            p.candidate.strategy.as_str(),
        )
    }));
    let oev = matches!(&resolution, Resolution::Strategy(s) if s == OLDEST_EMULATION_VERSION);
    let skew = skew_violations(&parsed, rules);
    let standings = standings(&parsed, oev, &skew, rules);
    let decision = |action| Decision {
        action,
        strategy: resolution.clone(),
        standings: standings.clone(),
        skew_violations: skew.clone(),
    };

    let strategy = match &resolution {
        Resolution::NoCandidates => return decision(Action::Nothing),
        Resolution::Conflict { .. } => return decision(Action::StrategyConflict),
        Resolution::Strategy(s) => s.clone(),
    };
    // A Lease the arbiter did not make: its holder (a client-go leader that may still run) is
    // waited out, unchanged for its full duration on the arbiter's clock; then the Lease is taken
    // over like one that nobody holds (its holder never held an arbiter term). Under a
    // third-party strategy it is left alone, as the arbiter leaves such Leases.
    let adopted;
    let lease = match lease {
        Some(l) if l.foreign && !oev => return decision(Action::Nothing),
        Some(l) if l.foreign => {
            if let (Some(holder), false) = (&l.holder, l.expired()) {
                let remaining = l.duration.saturating_sub(l.unchanged_for);
                return decision(Action::WaitForForeign {
                    holder: holder.clone(),
                    remaining,
                });
            }
            adopted = Lease {
                holder: None,
                preferred_holder: None,
                released_by: None,
                holder_pod_stopped: false,
                switchover: None,
                ..l.clone()
            };
            Some(&adopted)
        }
        l => l,
    };
    if !oev {
        return decision(match lease {
            None => Action::CreateLease {
                holder: None,
                strategy,
            },
            Some(l) if l.strategy.as_deref() != Some(&strategy) => Action::SetStrategy { strategy },
            Some(_) => Action::Nothing,
        });
    }

    if let Some(remaining) = previous.and_then(|p| term_left(p, lease)) {
        let holder = previous.map(|p| p.holder.clone()).unwrap_or_default();
        return decision(Action::WaitForTerm { holder, remaining });
    }

    let eligible: Vec<&Parsed> = parsed
        .iter()
        .filter(|p| matches!(standings[&p.candidate.name], Standing::Eligible(_)))
        .collect();
    let ranked: Vec<(Ranked, Liveness)> = eligible.iter().filter_map(|p| rank(p)).collect();
    let best_of = |filter: &dyn Fn(Liveness) -> bool| {
        oldest_emulation::pick_best(ranked.iter().filter(|(_, l)| filter(*l)).map(|(r, _)| r))
            .map(|r| r.name.to_string())
    };
    let liveness_of = |name: &str| ranked.iter().find(|(r, _)| r.name == name).map(|(_, l)| *l);
    // An acknowledgement counts towards taking over only if it answered a ping sent after
    // `since`: an older one may come from a process that has exited since (one that lost its
    // own term, or crashed), and handing over to it would stop a live holder for nobody.
    let pinged = |name: &str| {
        candidates
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.ping)
            .map(|p| p.sent)
    };
    let answered_since = |name: &str, l: Liveness, since: Option<Timestamp>| match (l, since) {
        (Liveness::Acked, Some(since)) if pinged(name).is_none_or(|p| p < since) => {
            Liveness::Unknown
        }
        _ => l,
    };

    // Only the caller's proof about what took the term ends it early (the pod recorded at the
    // assignment, the incarnation that renewed it): the pod the holder's candidate names now is
    // whatever its writer put there.
    let holder_live =
        lease.is_some_and(|l| l.holder.is_some() && !l.expired() && !l.holder_pod_stopped);

    if let (true, Some(l), Some(sw)) = (
        holder_live,
        lease,
        lease.and_then(|l| l.switchover.as_ref()),
    ) {
        let holder = l.holder.as_deref().unwrap_or_default();
        let began = l.term_seen.filter(|a| *a <= now);
        let target = if (sw.holder.as_str(), sw.term) != (holder, l.term) {
            Err(format!(
                "the lease moved on: it was asked of {} at term {}, and {holder} holds term {} now",
                sw.holder, sw.term, l.term
            ))
        } else {
            let eligible: Vec<&Ranked> = ranked.iter().map(|(r, _)| r).collect();
            switchover_target(sw.to.as_deref(), holder, &eligible)
        };
        let action = match target {
            Err(reason) => Action::RefuseSwitchover { reason },
            Ok(to) => match liveness_of(&to).map(|lv| answered_since(&to, lv, began)) {
                Some(Liveness::Acked) if l.preferred_holder.as_deref() == Some(&to) => {
                    Action::WaitForRelease { to }
                }
                Some(Liveness::Acked) => Action::RequestHandover { to },
                Some(Liveness::Pending) => Action::WaitForAcks,
                _ => Action::Ping {
                    candidates: vec![to],
                },
            },
        };
        return decision(action);
    }

    if let (true, Some(l)) = (holder_live, lease) {
        let holder = l.holder.as_deref().unwrap_or_default();
        // Only a strictly better version takes over from a live holder: ties on versions
        // (decided by age or name) never disturb it, so the lease does not flip back and forth.
        let versions = |name: &str| {
            ranked
                .iter()
                .find(|(r, _)| r.name == name)
                .map(|(r, _)| (r.emulation, r.binary))
        };
        let best =
            best_of(&|_| true).filter(|b| versions(b).is_none_or(|v| Some(v) != versions(holder)));
        let action = match best {
            None if l.preferred_holder.is_some() => Action::ClearPreferredHolder,
            None => Action::Nothing,
            Some(best) if best == holder => match &l.preferred_holder {
                Some(_) => Action::ClearPreferredHolder,
                None => Action::Nothing,
            },
            // The target must have answered during this term (a ping after `acquireTime`; one
            // ahead of this clock, from a skewed replica or a hand edit, is not waited for).
            Some(best) => {
                let began = l.term_seen.filter(|a| *a <= now);
                let target = candidates.iter().find(|c| c.name == best);
                // Asked for only once the pool has settled, and pinged only then: the holder
                // works meanwhile, and its release then goes to the target at once.
                let settle = target
                    .filter(|_| l.preferred_holder.as_deref() != Some(&best))
                    .and_then(|t| {
                        settle_before_asking(&registrations(&ranked, candidates), t, now, rules)
                    });
                match liveness_of(&best).map(|lv| answered_since(&best, lv, began)) {
                    _ if let Some(remaining) = settle => Action::Settle { remaining },
                    Some(Liveness::Acked) if l.preferred_holder.as_deref() == Some(&best) => {
                        Action::WaitForRelease { to: best }
                    }
                    Some(Liveness::Acked) => Action::RequestHandover { to: best },
                    Some(Liveness::Pending) => Action::WaitForAcks,
                    _ => Action::Ping {
                        candidates: vec![best],
                    },
                }
            }
        };
        return decision(action);
    }

    // An election: learn who is alive, then elect the best of those that answered. A holder
    // whose term lapsed without a renew, or that just stepped down, does not get the next term
    // while anyone else can take it: re-electing it would only repeat the lapse or undo the
    // release (and a stepping-down candidate may be on its way out).
    let lapsed = lease
        .filter(|l| l.expired())
        .and_then(|l| l.holder.as_deref());
    let stepped_down = lease
        .filter(|l| l.holder.is_none())
        .and_then(|l| l.released_by.as_deref());
    // A holder that stepped down (a handover, a switchover) and is still eligible is passed over
    // only for a candidate at its versions or older: if the one it stepped down for went away,
    // a newer version must not take charge while it still runs.
    let versions_of = |name: &str| {
        ranked
            .iter()
            .find(|(r, _)| r.name == name)
            .map(|(r, _)| (r.emulation, r.binary))
    };
    let may_replace = |r: &Ranked, h: &str| {
        lapsed.is_some() || versions_of(h).is_none_or(|v| (r.emulation, r.binary) <= v)
    };
    let pool: Vec<(Ranked, Liveness)> = match lapsed.or(stepped_down) {
        Some(h) if ranked.iter().any(|(r, _)| r.name != h && may_replace(r, h)) => ranked
            .iter()
            .filter(|(r, _)| r.name != h)
            .cloned()
            .collect(),
        _ => ranked.clone(),
    };
    // Candidates started together are counted before anyone from the pool is elected.
    if let Some(remaining) = gather(&registrations(&pool, candidates), lease, now, rules) {
        return decision(Action::Settle { remaining });
    }
    // After a release (a handover, or a holder stepping down) the next holder must have
    // answered since the arbiter saw the release: the target of a handover may have exited
    // while the holder was stopping.
    let released_seen = lease.filter(|_| stepped_down.is_some()).and_then(|l| {
        now.checked_sub(SignedDuration::try_from(l.unchanged_for).ok()?)
            .ok()
    });
    let pool: Vec<(Ranked, Liveness)> = pool
        .into_iter()
        .map(|(r, lv)| {
            let lv = answered_since(r.name, lv, released_seen);
            (r, lv)
        })
        .collect();
    // The order of the election: among equals, the candidate the handover was for (the
    // preferred holder, e.g. a switchover's target) rather than the older or alphabetically
    // first.
    let preferred = lease.and_then(|l| l.preferred_holder.as_deref());
    let order = |a: &Ranked, b: &Ranked| oldest_emulation::compare_preferring(a, b, preferred);
    let top_of = |rs: &mut dyn Iterator<Item = &Ranked<'_>>| -> Option<String> {
        rs.min_by(|a, b| order(a, b)).map(|r| r.name.to_string())
    };
    // Those not yet heard from only matter if one of them could outrank every candidate that
    // acknowledged: when the best that could still answer has already answered, waiting could
    // not change the outcome, so it is elected at once.
    let best_possible = top_of(
        &mut pool
            .iter()
            .filter(|(_, l)| *l != Liveness::Unresponsive)
            .map(|(r, _)| r),
    );
    let best_answered = best_possible.as_deref().is_some_and(|best| {
        pool.iter()
            .any(|(r, l)| r.name == best && *l == Liveness::Acked)
    });
    if !best_answered {
        // Only those that could outrank every candidate that answered are asked. The best of
        // them is asked alone: it usually answers, and then nobody else needs a ping (nor
        // writes an answer). Once a candidate of this lease has ignored a ping, all of them
        // are asked at once, so that a dead candidate costs an election one ack window more,
        // not one per dead candidate.
        let best_acked = pool
            .iter()
            .filter(|(_, l)| *l == Liveness::Acked)
            .map(|(r, _)| r)
            .min_by(|a, b| order(a, b));
        let open: Vec<&(Ranked, Liveness)> = pool
            .iter()
            .filter(|(_, l)| matches!(l, Liveness::Unknown | Liveness::Pending))
            .filter(|(r, _)| best_acked.is_none_or(|b| order(r, b).is_lt()))
            .collect();
        let someone_silent = standings
            .values()
            .any(|s| *s == Standing::Ineligible(Reason::Unresponsive));
        let to_ping: Vec<String> = if someone_silent {
            let mut unknown: Vec<String> = open
                .iter()
                .filter(|(_, l)| *l == Liveness::Unknown)
                .map(|(r, _)| r.name.to_string())
                .collect();
            unknown.sort();
            unknown
        } else {
            open.iter()
                .min_by(|(a, _), (b, _)| order(a, b))
                .filter(|(_, l)| *l == Liveness::Unknown)
                .map(|(r, _)| vec![r.name.to_string()])
                .unwrap_or_default()
        };
        if !to_ping.is_empty() {
            return decision(Action::Ping {
                candidates: to_ping,
            });
        }
        if open.iter().any(|(_, l)| *l == Liveness::Pending) {
            return decision(Action::WaitForAcks);
        }
    }
    let best = top_of(
        &mut pool
            .iter()
            .filter(|(_, l)| *l == Liveness::Acked)
            .map(|(r, _)| r),
    );
    let action = match (best, lease) {
        (None, _) => Action::NoEligibleCandidate,
        (Some(holder), None) => Action::CreateLease {
            holder: Some(holder),
            strategy,
        },
        (Some(holder), Some(_)) => Action::Assign {
            lapsed: lapsed.filter(|l| *l != holder).map(str::to_string),
            holder,
        },
    };
    decision(action)
}

/// When the arbiter saw each candidate that can lead (eligible, its versions read) register,
/// on its own clock (`None`: before this process started): what the settle counts.
fn registrations(
    ranked: &[(Ranked, Liveness)],
    candidates: &[Candidate],
) -> Vec<Option<Timestamp>> {
    ranked
        .iter()
        .map(|(r, _)| {
            candidates
                .iter()
                .find(|c| c.name == r.name)
                .and_then(|c| c.registered)
        })
        .collect()
}

fn age(at: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(at)).unwrap_or(Duration::ZERO)
}

/// How much longer the pool must settle (no candidate that can lead registered for
/// `rules.settle`), counting at most an ack window from `since`: someone who keeps
/// registering, or recreating candidates, cannot hold it up for ever. `None`: settled.
fn settling(
    pool: &[Option<Timestamp>],
    since: Duration,
    now: Timestamp,
    rules: &Rules,
) -> Option<Duration> {
    let newest = pool.iter().flatten().max().map(|r| age(*r, now))?;
    (newest < rules.settle && since < rules.ack_window)
        .then(|| (rules.settle - newest).min(rules.ack_window - since))
}

/// The gather: an election with no live holder waits, so that candidates started together
/// register a moment apart and the oldest version among them leads from its first term,
/// instead of the first to register (a newer version leading until it hands over).
///
/// - A lease's **first election** (no term ever assigned on it by the arbiter, or a Lease it
///   is about to adopt) waits until no candidate that can lead has registered for the settle.
/// - **After a term ended** (a release, an expiry, a stopped pod) it waits only when no
///   candidate it could elect was there before: every one registered after the term ended, or
///   within the settle before (the pool started again), and then until no candidate has
///   registered for the settle, as a first election does. `pool` is who the election picks
///   from (not the holder that just stepped down or lapsed, while anyone else can lead). With
///   a candidate from before (or one registered before this process saw it happen), the
///   election is at once, among everyone there: a better candidate that registered a moment
///   ago is elected, and one older still that comes a moment later is handed over to once the
///   pool has settled ([`settle_before_asking`]), while the one elected works. Waiting then
///   would cost leaderless time, which a handover asked for later does not.
///
/// Either waits at most an ack window from when the lease became electable.
fn gather(
    pool: &[Option<Timestamp>],
    lease: Option<&Lease>,
    now: Timestamp,
    rules: &Rules,
) -> Option<Duration> {
    let first = lease.is_none_or(|l| l.term == 0 || l.foreign);
    let electable_for = match lease {
        // Its term expired: since then; released, stopped or never held: since the record.
        Some(l) if l.expired() && l.holder.is_some() => l.unchanged_for.saturating_sub(l.duration),
        Some(l) => l.unchanged_for,
        // A first election: since its first candidate registered.
        None => pool.iter().flatten().min().map(|r| age(*r, now))?,
    };
    // Registered at least a settle before the lease became electable (or before this process
    // saw it happen): there before, and counted.
    let from_before = |r: &Option<Timestamp>| {
        r.is_none_or(|r| age(r, now) >= electable_for.saturating_add(rules.settle))
    };
    if !first && pool.iter().any(from_before) {
        return None;
    }
    settling(pool, electable_for, now, rules)
}

/// Before a live holder is asked to hand over to `target`, a better candidate: the pool must
/// have settled (candidates started together counted, so the holder hands over once, to the
/// oldest of them), at most an ack window after the target registered (its latest
/// registration: a new process of it is a new registration). The holder works meanwhile; the
/// target is pinged only then (its answer is fresh when the holder is asked), and the
/// holder's release then goes to it at once.
fn settle_before_asking(
    pool: &[Option<Timestamp>],
    target: &Candidate,
    now: Timestamp,
    rules: &Rules,
) -> Option<Duration> {
    let since = age(target.registered?, now);
    settling(pool, since, now, rules)
}

/// The candidate a planned switchover goes to, or why it cannot be done: the named one (`to`),
/// or else the best other one, must be among the `eligible` candidates, not the holder, and at
/// the top versions among them (the rules would elect it but for ties). `arbiter handover`
/// checks with the same function, from the conditions the operator reported.
pub fn switchover_target(
    to: Option<&str>,
    holder: &str,
    eligible: &[&Ranked],
) -> Result<String, String> {
    let top = oldest_emulation::pick_best(eligible.iter().copied())
        .map(|r| (r.emulation.clone(), r.binary.clone()));
    let at_top = |r: &Ranked| top.as_ref() == Some(&(r.emulation.clone(), r.binary.clone()));
    match to {
        Some(to) if to == holder => Err(format!("{to} already holds the lease")),
        Some(to) => {
            let Some(r) = eligible.iter().find(|r| r.name == to) else {
                return Err(format!("{to} is not an eligible candidate of this lease"));
            };
            if !at_top(r) {
                let (e, b) = top.expect("a ranked candidate");
                return Err(format!(
                    "{to} runs emulation {} / binary {}, but the rules elect {e} / {b} (the oldest among eligible candidates): a switchover may pick among equals, never a newer version",
                    r.emulation, r.binary
                ));
            }
            Ok(to.to_string())
        }
        None => oldest_emulation::pick_best(
            eligible
                .iter()
                .copied()
                .filter(|r| r.name != holder && at_top(r)),
        )
        .map(|r| r.name.to_string())
        .ok_or_else(|| "no other eligible candidate runs the versions the rules elect".to_string()),
    }
}

/// The election held while `unwrapped` pods run the lease's command without an agent (pods
/// labelled for injection that were not injected: the operator's `workloads::unwrapped`): an action
/// that would give the lease to someone waits instead, as a new holder's command would run
/// beside theirs. Every other action stands: a holder keeps its lease (its command already
/// runs), a handover is still asked for and carried out by the holder, pings still go out, so
/// that a successor is known alive the moment the last unwrapped pod is gone.
pub fn held_for_unwrapped(action: Action, unwrapped: usize) -> Action {
    match action.elects() {
        Some(holder) if unwrapped > 0 => Action::WaitForUnwrapped {
            holder: holder.to_string(),
            pods: unwrapped,
        },
        _ => action,
    }
}

/// How long the previous holder's term may still run although the Lease no longer names it:
/// `None` when the Lease names it (the ordinary rules apply), or its term certainly ended
/// (it released the lease itself, its pod is confirmed stopped, or its lease expired).
fn term_left(p: &Previous, lease: Option<&Lease>) -> Option<Duration> {
    if lease.is_some_and(|l| l.holder.as_deref() == Some(p.holder.as_str())) {
        return None;
    }
    let released_itself = lease
        .is_some_and(|l| l.holder.is_none() && l.released_by.as_deref() == Some(p.holder.as_str()));
    if released_itself || p.pod_stopped || p.quiet_for >= p.duration {
        return None;
    }
    Some(p.duration - p.quiet_for)
}

/// The candidate's place in the OldestEmulationVersion order, if its versions parse.
fn rank<'a>(p: &'a Parsed<'a>) -> Option<(Ranked<'a>, Liveness)> {
    let (Ok(binary), Some(Ok(emulation))) = (&p.binary, &p.emulation) else {
        return None;
    };
    let c = p.candidate;
    Some((
        Ranked {
            name: &c.name,
            emulation,
            binary,
            created: c.created,
        },
        p.liveness,
    ))
}

/// The oldest binaryVersion among live candidates: the reference for the skew rule.
fn oldest_live(parsed: &[Parsed]) -> Option<Version> {
    parsed
        .iter()
        .filter(|p| p.candidate.present() && p.liveness != Liveness::Unresponsive)
        .filter_map(|p| p.binary.as_ref().ok())
        .min()
        .cloned()
}

/// Live candidates whose binaryVersion is more than `max_skew` minor versions (or a major
/// version) from the oldest live one, sorted by name.
fn skew_violations(parsed: &[Parsed], rules: &Rules) -> Vec<SkewViolation> {
    let (Some(max), Some(oldest)) = (rules.max_skew, oldest_live(parsed)) else {
        return Vec::new();
    };
    let mut out: Vec<SkewViolation> = parsed
        .iter()
        .filter(|p| p.candidate.present() && p.liveness != Liveness::Unresponsive)
        .filter_map(|p| {
            let v = p.binary.as_ref().ok()?;
            v.minor_distance(&oldest)
                .is_none_or(|d| d > max)
                .then(|| SkewViolation {
                    candidate: p.candidate.name.clone(),
                    version: v.clone(),
                    oldest: oldest.clone(),
                })
        })
        .collect();
    out.sort_by(|a, b| a.candidate.cmp(&b.candidate));
    out
}

/// `emulation` parsed, refused when it is above `binary` (which the CRD refuses too, but not
/// between two pre-releases of one version, nor for a candidate written before it did).
fn emulation_of(emulation: &str, binary: &str) -> Result<Version, VersionError> {
    let parsed = Version::parse(emulation)?;
    match Version::parse(binary) {
        Ok(b) if parsed > b => Err(VersionError {
            input: emulation.to_string(),
            reason: format!("above binaryVersion {binary}"),
        }),
        _ => Ok(parsed),
    }
}

fn standings(
    parsed: &[Parsed],
    oev: bool,
    skew: &[SkewViolation],
    rules: &Rules,
) -> BTreeMap<String, Standing> {
    parsed
        .iter()
        .map(|p| {
            let c = p.candidate;
            let violation = skew
                .iter()
                .find(|v| v.candidate == c.name)
                .filter(|_| rules.refuse_skew);
            let standing = match (&p.binary, &p.emulation) {
                (Err(e), _) | (_, Some(Err(e))) => {
                    Standing::Ineligible(Reason::InvalidVersion(e.clone()))
                }
                (Ok(_), None) if oev => Standing::Ineligible(Reason::NoEmulationVersion),
                _ if !c.pod.electable() => Standing::Ineligible(Reason::PodNotRunning(c.pod)),
                _ if c.withdrawn => Standing::Ineligible(Reason::Withdrawn),
                _ if p.liveness == Liveness::Unresponsive => {
                    Standing::Ineligible(Reason::Unresponsive)
                }
                _ if violation.is_some() => {
                    Standing::Ineligible(Reason::Skew(violation.cloned().expect("checked")))
                }
                _ => Standing::Eligible(p.liveness),
            };
            (c.name.clone(), standing)
        })
        .collect()
}

#[cfg(test)]
mod tests;
