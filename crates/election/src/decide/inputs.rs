//! What [`super::decide`] is given: the lease's candidates as the arbiter sees them, the Lease
//! record, the holder the arbiter itself last saw, and the rules' tunables. Every time here is
//! a point on the arbiter's own clock or a duration it measured; nothing a candidate or a hand
//! edit wrote is compared with it.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::{Ping, PodState};

/// A candidate as the arbiter sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub name: String,
    pub binary_version: String,
    pub emulation_version: Option<String>,
    pub strategy: String,
    pub created: Timestamp,
    /// The arbiter's own last ping to it and whether it answered ([`crate::heard`]): points on
    /// the arbiter's own clock, never a timestamp the candidate or anyone else wrote.
    pub ping: Option<Ping>,
    /// The arbiter saw it renew on its own within the ack validity (judged by the caller on
    /// its own clocks: [`crate::heard`]): alive without a ping, unless a ping it ignored says
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
    pub(super) fn present(&self) -> bool {
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

    /// Its holder's term runs: it names a holder, has not expired, and the holder's work is
    /// not confirmed stopped. Only the caller's proof about what took the term ends it early
    /// (the pod recorded at the assignment, the incarnation that renewed it): the pod the
    /// holder's candidate names now is whatever its writer put there.
    pub(super) fn holder_live(&self) -> bool {
        self.holder.is_some() && !self.expired() && !self.holder_pod_stopped
    }

    /// The holder whose term lapsed, and what an answer must have come after to prove a
    /// candidate alive now (on the clock `now` is read on).
    pub(super) fn lapse(&self, now: Timestamp) -> Option<(&str, Lapse)> {
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
pub(super) struct Lapse {
    pub(super) lapsed: Timestamp,
    pub(super) began: Timestamp,
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
