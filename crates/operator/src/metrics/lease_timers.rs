//! When a lease became leaderless, and when a handover was requested: what the leaderless and
//! handover metrics measure, judged one reconcile at a time (pure, so that it can be tested).

use std::time::{Duration, Instant};

use arbiter_election::decide::Action;

/// One lease's running timers.
#[derive(Default)]
pub(crate) struct Timers {
    leaderless_since: Option<Instant>,
    handover_requested: Option<Instant>,
}

/// What a reconcile ended, to add to the metrics.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Ended {
    /// A handover requested this long ago is done (the new holder was assigned).
    pub handover: Option<Duration>,
    /// The lease was judged leaderless for this long: until a holder was assigned, or until it
    /// was seen held again without one (its holder renewed after all, or the view that showed
    /// it expired was a stale one).
    pub leaderless: Option<Duration>,
}

impl Timers {
    /// A reconcile at `now` that saw the lease `leaderless` (no holder, or expired), carried
    /// out `action` and `written` says whether it wrote the Lease.
    pub fn step(
        &mut self,
        leaderless: bool,
        action: &Action,
        written: bool,
        now: Instant,
    ) -> Ended {
        let mut ended = Ended::default();
        if leaderless && self.leaderless_since.is_none() {
            self.leaderless_since = Some(now);
        }
        let assigned = written
            && matches!(
                action,
                Action::Assign { .. }
                    | Action::CreateLease {
                        holder: Some(_),
                        ..
                    }
            );
        match action {
            Action::RequestHandover { .. } if written && self.handover_requested.is_none() => {
                self.handover_requested = Some(now)
            }
            _ if assigned => {
                ended.handover = self.handover_requested.take().map(|since| now - since);
            }
            _ => {}
        }
        if assigned || !leaderless {
            ended.leaderless = self.leaderless_since.take().map(|since| now - since);
        }
        ended
    }

    /// Since when the lease has been leaderless, if it is.
    pub fn leaderless_since(&self) -> Option<Instant> {
        self.leaderless_since
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn assign() -> Action {
        Action::Assign {
            holder: "b".into(),
            lapsed: None,
        }
    }

    #[test]
    fn leaderless_until_a_holder_is_assigned() {
        let (mut t, t0) = (Timers::default(), Instant::now());
        assert_eq!(
            t.step(true, &Action::WaitForAcks, false, t0),
            Ended::default()
        );
        assert_eq!(t.leaderless_since(), Some(t0));
        let ended = t.step(true, &assign(), true, t0 + 3 * S);
        assert_eq!(ended.leaderless, Some(3 * S));
        assert_eq!(t.leaderless_since(), None);
        // An assignment that failed to be written ends nothing.
        let mut t = Timers::default();
        t.step(true, &assign(), false, t0);
        assert_eq!(t.leaderless_since(), Some(t0));
    }

    #[test]
    fn a_lease_seen_held_again_is_no_longer_leaderless() {
        // Judged expired on a stale view (or its holder renewed late), then seen held: the
        // gauge must not stay on "leaderless since" until some later election.
        let (mut t, t0) = (Timers::default(), Instant::now());
        t.step(true, &Action::NoEligibleCandidate, false, t0);
        let ended = t.step(false, &Action::Nothing, false, t0 + 2 * S);
        assert_eq!(ended.leaderless, Some(2 * S));
        assert_eq!(t.leaderless_since(), None);
        assert_eq!(
            t.step(false, &Action::Nothing, false, t0 + 3 * S),
            Ended::default()
        );
    }

    #[test]
    fn a_handover_is_timed_from_its_request_to_the_assignment() {
        let (mut t, t0) = (Timers::default(), Instant::now());
        let request = Action::RequestHandover { to: "b".into() };
        t.step(false, &request, true, t0);
        // Asked again (not written, or written again): still timed from the first request.
        t.step(false, &request, true, t0 + S);
        let ended = t.step(false, &assign(), true, t0 + 2 * S);
        assert_eq!(ended.handover, Some(2 * S));
        assert_eq!(ended.leaderless, None);
    }
}
