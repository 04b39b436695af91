//! How long a term's work can outlive its last renewal, and the relation that keeps it inside
//! the lease: a holder stops its work at the renew deadline (counted from the last renewal it
//! sent), and kills it a kill grace later; the arbiter gives the lease to anyone else only a
//! lease duration after it saw that renewal. The agent refuses timings that break the relation
//! ([`kill_grace_fits`]); the protocol model (`make model`) runs with the longest kill grace it
//! allows.

use std::time::Duration;

/// The least time between the guard's SIGKILL deadline and the lease's expiry: room for the
/// guard to wake, the kill to land, and the two monotonic clocks to differ a little.
pub const MIN_MARGIN: Duration = Duration::from_millis(500);

/// Whether a holder's work is certainly dead before the lease can go to anyone else: the renew
/// deadline, then the kill grace, then [`MIN_MARGIN`], within the lease duration.
pub fn kill_grace_fits(lease: Duration, renew_deadline: Duration, kill_grace: Duration) -> bool {
    renew_deadline + kill_grace + MIN_MARGIN <= lease
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_dies_inside_the_lease_with_a_margin() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // The defaults: 15 s lease, 10 s renew deadline, 3 s kill grace.
        assert!(kill_grace_fits(s(15), s(10), s(3)));
        assert!(
            kill_grace_fits(s(15), s(10), ms(4500)),
            "exactly the margin left"
        );
        assert!(!kill_grace_fits(s(15), s(10), ms(4501)));
        assert!(
            !kill_grace_fits(s(15), s(10), s(5)),
            "dead only as the lease ends"
        );
        assert!(!kill_grace_fits(s(15), s(15), Duration::ZERO));
    }
}
