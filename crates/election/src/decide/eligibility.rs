//! Eligibility: which candidates the rules may elect, and how each stands. A candidate is
//! eligible when its versions parse (with an emulationVersion under OldestEmulationVersion),
//! its pod runs (or it has none), it has not withdrawn, it did not ignore the last ping, and it
//! does not break a refused skew. Its liveness is the arbiter's own evidence ([`liveness`]);
//! after a term lapsed, only answers to pings sent since count. A holder is judged by its term
//! while it runs ([`holder_judged_by_its_term`]).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use crate::oldest_emulation::{self, Ranked};
use crate::strategy::{self, Resolution};
use crate::{Version, VersionError};

use super::{Candidate, Lease, Liveness, Ping, PodState, Reason, Rules, SkewViolation, Standing};

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
pub(super) fn holder_judged_by_its_term(
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

/// A candidate with its versions read and its liveness judged.
pub(super) struct Parsed<'a> {
    candidate: &'a Candidate,
    binary: Result<Version, VersionError>,
    emulation: Option<Result<Version, VersionError>>,
    liveness: Liveness,
}

/// Each candidate with its versions read and its liveness at `now`. After a term lapsed, an
/// answer counts only if it came to a ping sent since the lapse (the lapsed holder) or since
/// the term began (anyone else): [`Lease::lapse`].
pub(super) fn parse<'a>(
    candidates: &'a [Candidate],
    lease: Option<&Lease>,
    now: Timestamp,
    rules: &Rules,
) -> Vec<Parsed<'a>> {
    let lapse = lease.and_then(|l| l.lapse(now));
    candidates
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
        .collect()
}

/// The strategy that governs the lease. Candidates whose pods are gone or not running do not
/// get a say in it.
pub(super) fn strategy_of(parsed: &[Parsed]) -> Resolution {
    strategy::resolve(parsed.iter().filter(|p| p.candidate.present()).map(|p| {
        (
            p.candidate.name.as_str(),
            p.binary.as_ref().ok(),
            p.candidate.strategy.as_str(),
        )
    }))
}

/// The candidates the rules may elect (eligible, their versions read), ranked, with their
/// liveness; and what the handover and assignment rules read beside them.
pub(super) struct Field<'a> {
    pub(super) ranked: Vec<(Ranked<'a>, Liveness)>,
    pub(super) candidates: &'a [Candidate],
    pub(super) standings: &'a BTreeMap<String, Standing>,
    pub(super) now: Timestamp,
    pub(super) rules: &'a Rules,
}

impl<'a> Field<'a> {
    pub(super) fn new(
        parsed: &'a [Parsed<'a>],
        standings: &'a BTreeMap<String, Standing>,
        candidates: &'a [Candidate],
        now: Timestamp,
        rules: &'a Rules,
    ) -> Self {
        let ranked = parsed
            .iter()
            .filter(|p| matches!(standings[&p.candidate.name], Standing::Eligible(_)))
            .filter_map(rank)
            .collect();
        Field {
            ranked,
            candidates,
            standings,
            now,
            rules,
        }
    }

    /// The best of them by the rules, whatever their liveness.
    pub(super) fn best(&self) -> Option<String> {
        oldest_emulation::pick_best(self.ranked.iter().map(|(r, _)| r)).map(|r| r.name.to_string())
    }

    pub(super) fn liveness_of(&self, name: &str) -> Option<Liveness> {
        self.ranked
            .iter()
            .find(|(r, _)| r.name == name)
            .map(|(_, l)| *l)
    }

    /// A candidate's versions (emulation, binary), if it is eligible.
    pub(super) fn versions_of(&self, name: &str) -> Option<(&'a Version, &'a Version)> {
        self.ranked
            .iter()
            .find(|(r, _)| r.name == name)
            .map(|(r, _)| (r.emulation, r.binary))
    }

    /// `l`, unless it is an acknowledgement of a ping sent before `since`: an older one may
    /// come from a process that has exited since (one that lost its own term, or crashed), and
    /// handing over to it would stop a live holder for nobody.
    pub(super) fn answered_since(
        &self,
        name: &str,
        l: Liveness,
        since: Option<Timestamp>,
    ) -> Liveness {
        let pinged = self
            .candidates
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.ping)
            .map(|p| p.sent);
        match (l, since) {
            (Liveness::Acked, Some(since)) if pinged.is_none_or(|p| p < since) => Liveness::Unknown,
            _ => l,
        }
    }
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
pub(super) fn skew_violations(parsed: &[Parsed], rules: &Rules) -> Vec<SkewViolation> {
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

/// Where each candidate stands, by name: eligible with its liveness, or why not.
pub(super) fn standings(
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
