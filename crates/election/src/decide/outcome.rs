//! What [`super::decide`] returns: one [`Action`], and where every candidate stands.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::strategy::Resolution;
use crate::{Version, VersionError};

use super::PodState;

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
    /// The Lease is not the arbiter's ([`super::Lease::foreign`]) and its holder's term may still
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
    /// command unwrapped ([`super::held_for_unwrapped`]): nobody is given the lease until they are
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
