//! What the arbiter heard from a candidate, judged on its own clocks only.
//!
//! A candidate's `renewTime` and `pingTime` are wall-clock timestamps written by other hosts
//! (the candidate's, another operator replica's) or by hand: a claim, not a fact. A candidate
//! whose clock runs ahead writes a `renewTime` in the future, which upstream's
//! `renewTime >= pingTime` reads as an answer to every later ping, long after it died; a
//! `pingTime` written by a replica whose clock runs ahead looks unanswered until the wall clock
//! passes it. So the arbiter never compares such a timestamp with its own. It keeps, per
//! candidate, what it observed itself:
//!
//! - **Its own pings**: when this process wrote one, on its monotonic clock, and the
//!   candidate's `resourceVersion` and `renewTime` in the write's answer. The candidate
//!   **answered** once a later version of it (by `resourceVersion`, which the API server
//!   orders for one resource: KEP-5504) carries another `renewTime`: the candidate wrote it
//!   after the ping, whatever either clock says. A ping's answer window counts from when this
//!   process's watch first showed a version at or after the ping (an answer cannot arrive
//!   before it), and the answer proves life for the ack validity counted from the ping's
//!   write. Pings written by anyone else (another replica, a hand edit) count for nothing.
//! - **Renewals seen as they happened**: a `renewTime` change the watch delivered live (not in
//!   a relist, which may bring writes of long ago), timed from its delivery on the monotonic
//!   clock, and only if the timestamp was not older than the validity, nor ahead of the
//!   arbiter's wall clock by more than [`AHEAD`], when it was delivered (a watch that delivers
//!   an old write late must not pass it for a fresh one; a candidate whose clock runs ahead is
//!   simply pinged). A timestamp in the future therefore counts as "now" at most once, on the
//!   delivery of the change that wrote it, and never as an answer to a ping.
//!
//! [`Heard::judge`] turns this into the election's inputs: instants on the arbiter's monotonic
//! clock become points on its own wall-clock timeline (`now - elapsed`), which is the only
//! clock [`super::decide`] compares anything on.

use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};

/// How far ahead of the arbiter's wall clock a delivered `renewTime` may be and still count
/// as a renewal seen as it happened.
pub const AHEAD: Duration = Duration::from_secs(1);

/// One version of a candidate, as the watch (or a write's answer) delivered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    /// `metadata.resourceVersion`, as a number (`None`: not a number, so not ordered).
    pub resource_version: Option<u64>,
    /// `spec.renewTime`.
    pub renew: Option<Timestamp>,
}

/// The arbiter's last ping to a candidate, as the election sees it: points on the arbiter's
/// own clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ping {
    /// When this process wrote it.
    pub sent: Timestamp,
    /// When this process's watch first showed a version at or after it (`None`: not yet).
    pub shown: Option<Timestamp>,
    /// The candidate wrote its `renewTime` after it.
    pub answered: bool,
}

/// What the election needs to know of a candidate's liveness (see [`Heard::judge`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Judged {
    pub ping: Option<Ping>,
    /// A renewal of its own was seen as it happened, within the ack validity.
    pub renewed_lately: bool,
    /// When this process saw it register (a new candidate, or a new process of it), as it
    /// happened: a point on the arbiter's own clock.
    pub registered: Option<Timestamp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Sent {
    at: Instant,
    version: u64,
    /// `renewTime` in the version the ping made.
    renew: Option<Timestamp>,
    shown: Option<Instant>,
    answered: bool,
}

/// What the arbiter heard from one candidate. Pure: fed versions and its own pings, with the
/// instants (and, for a delivery, the wall-clock time) the caller read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Heard {
    /// The highest resourceVersion delivered so far.
    last_version: Option<u64>,
    /// `renewTime` as last delivered.
    renew: Option<Timestamp>,
    /// The last renewal seen as it happened: when it was delivered, and how old the timestamp
    /// was then by the arbiter's wall clock (never below zero).
    renewed: Option<(Instant, Duration)>,
    ping: Option<Sent>,
    /// When a registration was seen as it happened.
    registered: Option<Instant>,
}

impl Heard {
    /// A version delivered at `at` (`live`: a watch event as it happened, not a (re)list),
    /// when the arbiter's wall clock read `wall`.
    pub fn delivered(&mut self, v: Version, at: Instant, live: bool, wall: Timestamp) {
        // A version older than one already seen (never from one watch; a write's answer may
        // have overtaken it) says nothing new.
        if let (Some(rv), Some(last)) = (v.resource_version, self.last_version)
            && rv < last
        {
            return;
        }
        if v.renew != self.renew {
            self.renewed = match v.renew {
                Some(renew) if live => fresh(renew, wall).map(|age| (at, age)),
                _ => None,
            };
            self.renew = v.renew;
        }
        if v.resource_version.is_some() {
            self.last_version = v.resource_version;
        }
        self.check_ping(at);
    }

    /// A registration (the candidate created, or re-registered by a new process) was delivered
    /// as it happened, at `at`.
    pub fn registered(&mut self, at: Instant) {
        self.registered = Some(at);
    }

    /// This process wrote a ping at `at`; the write's answer is version `v`.
    pub fn pinged(&mut self, v: Version, at: Instant) {
        let Some(version) = v.resource_version else {
            // Not ordered: no answer could ever be told from an older write.
            self.ping = None;
            return;
        };
        self.ping = Some(Sent {
            at,
            version,
            renew: v.renew,
            shown: None,
            answered: false,
        });
        self.check_ping(at);
    }

    /// The watch has shown a version at or after the ping: from then on, any other
    /// `renewTime` was written after it.
    fn check_ping(&mut self, at: Instant) {
        let (Some(p), Some(last)) = (self.ping.as_mut(), self.last_version) else {
            return;
        };
        if last < p.version {
            return;
        }
        p.shown.get_or_insert(at);
        if self.renew != p.renew {
            p.answered = true;
        }
    }

    /// The election's view at `now` (monotonic) and `wall` (the arbiter's wall clock, read at
    /// the same moment): the last ping, and whether a renewal of its own seen within `valid`
    /// proves it alive.
    pub fn judge(&self, now: Instant, wall: Timestamp, valid: Duration) -> Judged {
        let point = |at: Instant| own_clock(at, now, wall);
        Judged {
            ping: self.ping.map(|p| Ping {
                sent: point(p.at),
                shown: p.shown.map(point),
                answered: p.answered,
            }),
            renewed_lately: self
                .renewed
                .is_some_and(|(at, age)| now.saturating_duration_since(at) + age <= valid),
            registered: self.registered.map(point),
        }
    }
}

/// How old a `renewTime` delivered when the wall clock read `wall` was, if it is no further
/// ahead than [`AHEAD`] (a timestamp within that counts as written now).
fn fresh(renew: Timestamp, wall: Timestamp) -> Option<Duration> {
    let age = wall.duration_since(renew);
    if age < -SignedDuration::try_from(AHEAD).expect("a small duration") {
        return None;
    }
    Some(Duration::try_from(age).unwrap_or(Duration::ZERO))
}

/// `at` on the arbiter's monotonic clock as a point on its wall-clock timeline, given that the
/// two read `now` and `wall` at the same moment.
pub fn own_clock(at: Instant, now: Instant, wall: Timestamp) -> Timestamp {
    let ago = SignedDuration::try_from(now.saturating_duration_since(at)).unwrap_or_default();
    let ahead = SignedDuration::try_from(at.saturating_duration_since(now)).unwrap_or_default();
    wall.checked_sub(ago)
        .and_then(|t| t.checked_add(ahead))
        .unwrap_or(wall)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const VALID: Duration = Duration::from_secs(10);

    fn wall() -> Timestamp {
        "2026-06-01T12:00:00Z".parse().unwrap()
    }

    fn secs(s: i64) -> SignedDuration {
        SignedDuration::from_secs(s)
    }

    fn v(rv: u64, renew: Timestamp) -> Version {
        Version {
            resource_version: Some(rv),
            renew: Some(renew),
        }
    }

    /// What the judge says of the ping at `now` (monotonic offset from t0).
    fn ping_of(h: &Heard, t0: Instant, after: Duration) -> Option<(bool, bool)> {
        h.judge(t0 + after, wall() + secs(after.as_secs() as i64), VALID)
            .ping
            .map(|p| (p.shown.is_some(), p.answered))
    }

    /// Every rule for the timestamps another host wrote: in the future, in the past,
    /// unchanged, and changed after the ping.
    #[test]
    fn only_a_renew_time_changed_after_the_ping_answers_it_whatever_its_value() {
        let t0 = Instant::now();
        let cases: [(&str, Timestamp, Timestamp, Option<bool>); 6] = [
            // (what, renewTime before the ping, renewTime in the next version, answered?)
            (
                "changed, in the past",
                wall() - secs(60),
                wall() - secs(30),
                Some(true),
            ),
            (
                "changed, an hour ahead",
                wall() - secs(60),
                wall() + secs(3600),
                Some(true),
            ),
            (
                "changed, behind the ping",
                wall(),
                wall() - secs(5),
                Some(true),
            ),
            (
                "unchanged, an hour ahead",
                wall() + secs(3600),
                wall() + secs(3600),
                Some(false),
            ),
            (
                "unchanged, in the past",
                wall() - secs(5),
                wall() - secs(5),
                Some(false),
            ),
            ("unchanged, just now", wall(), wall(), Some(false)),
        ];
        for (what, before, after, answered) in cases {
            let mut h = Heard::default();
            h.delivered(v(10, before), t0, true, wall());
            h.pinged(v(11, before), t0 + S);
            // The ping's own version comes back through the watch, then the next one.
            h.delivered(v(11, before), t0 + 2 * S, true, wall());
            h.delivered(v(12, after), t0 + 3 * S, true, wall());
            assert_eq!(ping_of(&h, t0, 4 * S).map(|(_, a)| a), answered, "{what}");
        }
    }

    #[test]
    fn a_version_older_than_the_ping_answers_nothing_even_delivered_after_it() {
        let t0 = Instant::now();
        let mut h = Heard::default();
        h.delivered(v(10, wall() - secs(60)), t0, true, wall());
        // The write's answer carries the renewal written before it (version 11) ...
        h.pinged(v(12, wall() - secs(1)), t0 + S);
        // ... which a lagging watch delivers after the ping was written.
        h.delivered(v(11, wall() - secs(1)), t0 + 2 * S, true, wall());
        assert_eq!(ping_of(&h, t0, 3 * S), Some((false, false)));
        // The ping's own version: shown, not answered.
        h.delivered(v(12, wall() - secs(1)), t0 + 3 * S, true, wall());
        assert_eq!(ping_of(&h, t0, 3 * S), Some((true, false)));
    }

    #[test]
    fn an_answer_the_watch_delivered_before_the_pings_write_returned_counts() {
        let t0 = Instant::now();
        let mut h = Heard::default();
        h.delivered(v(10, wall() - secs(60)), t0, true, wall());
        // The answer overtook the ping write's own answer.
        h.delivered(v(12, wall()), t0 + S, true, wall());
        h.pinged(v(11, wall() - secs(60)), t0 + S);
        assert_eq!(ping_of(&h, t0, 2 * S), Some((true, true)));
    }

    #[test]
    fn a_relist_showing_a_later_version_answers_the_ping_but_is_no_renewal_seen_live() {
        let t0 = Instant::now();
        let mut h = Heard::default();
        h.delivered(v(10, wall() - secs(60)), t0, true, wall());
        h.pinged(v(11, wall() - secs(60)), t0 + S);
        h.delivered(v(15, wall()), t0 + 2 * S, false, wall());
        let j = h.judge(t0 + 2 * S, wall(), VALID);
        assert!(j.ping.is_some_and(|p| p.answered));
        assert!(!j.renewed_lately);
    }

    #[test]
    fn a_ping_written_by_someone_else_is_no_ping_of_ours() {
        let t0 = Instant::now();
        let mut h = Heard::default();
        // Only versions: whatever pingTime they carry, no ping of this process.
        h.delivered(v(10, wall()), t0, false, wall());
        h.delivered(v(11, wall()), t0 + S, true, wall());
        assert_eq!(h.judge(t0 + S, wall(), VALID).ping, None);
    }

    #[test]
    fn a_renewal_counts_when_seen_as_it_happened_and_its_timestamp_is_not_ahead() {
        let t0 = Instant::now();
        let lately = |renew: Timestamp, live: bool, judged_after: Duration| {
            let mut h = Heard::default();
            h.delivered(v(10, wall() - secs(600)), t0, false, wall());
            h.delivered(v(11, renew), t0, live, wall());
            h.judge(t0 + judged_after, wall(), VALID).renewed_lately
        };
        assert!(lately(wall(), true, Duration::ZERO));
        assert!(lately(wall(), true, VALID), "for the validity");
        assert!(!lately(wall(), true, VALID + S), "not after it");
        assert!(!lately(wall(), false, Duration::ZERO), "not from a relist");
        assert!(
            lately(wall() - secs(4), true, 6 * S),
            "4 s old when delivered, 6 s since: 10 s"
        );
        assert!(!lately(wall() - secs(4), true, 7 * S));
        assert!(
            !lately(wall() - secs(30), true, Duration::ZERO),
            "an old write delivered late"
        );
        assert!(
            lately(wall() + SignedDuration::from_millis(900), true, S),
            "less than a second ahead: now"
        );
        assert!(
            !lately(wall() + secs(2), true, Duration::ZERO),
            "further ahead: pinged instead"
        );
        assert!(
            !lately(wall() + secs(3600), true, Duration::ZERO),
            "an hour ahead"
        );
    }

    #[test]
    fn a_timestamp_in_the_future_counts_as_now_at_most_once() {
        let t0 = Instant::now();
        let ahead = wall() + SignedDuration::from_millis(500);
        let mut h = Heard::default();
        h.delivered(v(10, ahead), t0, true, wall());
        assert!(h.judge(t0, wall(), VALID).renewed_lately);
        // Delivered again (a status write, a relist): not a new renewal.
        h.delivered(v(11, ahead), t0 + 20 * S, true, wall() + secs(20));
        h.delivered(v(12, ahead), t0 + 21 * S, false, wall() + secs(21));
        assert!(
            !h.judge(t0 + 21 * S, wall() + secs(21), VALID)
                .renewed_lately
        );
        // Nor an answer to a later ping.
        h.pinged(v(13, ahead), t0 + 22 * S);
        h.delivered(v(13, ahead), t0 + 22 * S, true, wall() + secs(22));
        assert_eq!(ping_of(&h, t0, 30 * S), Some((true, false)));
    }

    #[test]
    fn a_ping_written_without_an_ordered_version_is_forgotten() {
        let t0 = Instant::now();
        let mut h = Heard::default();
        h.pinged(
            Version {
                resource_version: None,
                renew: None,
            },
            t0,
        );
        assert_eq!(h.judge(t0, wall(), VALID).ping, None);
    }

    #[test]
    fn instants_become_points_on_the_arbiters_own_clock() {
        let t0 = Instant::now();
        assert_eq!(own_clock(t0, t0 + 5 * S, wall()), wall() - secs(5));
        assert_eq!(own_clock(t0 + 5 * S, t0, wall()), wall() + secs(5));
        let mut h = Heard::default();
        h.delivered(v(1, wall()), t0, true, wall());
        h.pinged(v(2, wall()), t0 + S);
        let p = h.judge(t0 + 3 * S, wall(), VALID).ping.unwrap();
        assert_eq!(p.sent, wall() - secs(2));
        assert_eq!(
            p.shown, None,
            "shown only by the watch, not by the write's answer"
        );
        h.delivered(v(2, wall()), t0 + 2 * S, true, wall() + secs(1));
        let p = h.judge(t0 + 3 * S, wall(), VALID).ping.unwrap();
        assert_eq!(p.shown, Some(wall() - secs(1)));
    }
}
