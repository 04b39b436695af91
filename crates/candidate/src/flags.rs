//! Command-line values shared by the subcommands: durations, and the error for a bad flag.
//!
//! Every flag error is a [`Usage`] error: the process prints it once and exits 2 before it
//! touches the cluster (the parsers below run inside clap, which does the same for its own).

use std::time::Duration;

/// A flag, or a combination of flags, that cannot work. Exit code 2, one message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// Fails with a [`Usage`] error.
#[macro_export]
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::new($crate::flags::Usage(format!($($arg)*))))
    };
}

/// An install's instance (`--instance`): see [`arbiter_api::check_instance`].
pub fn instance(s: &str) -> Result<String, String> {
    arbiter_api::check_instance(s).map(|()| s.to_string())
}

/// A duration such as `15s`, `500ms`, `1m`.
pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("invalid duration {s:?} ({e}): use e.g. 15s, 500ms, 1m"))
}

/// A duration greater than zero.
pub fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?} is zero: it must be greater than zero"));
    }
    Ok(d)
}

/// How long a candidate without a pod may go without renewing before the operator deletes it:
/// at least three of its agent's refreshes ([`crate::REFRESH`]), or a live
/// candidate whose writes fail for a while (retried at least every minute) would be deleted.
pub fn candidate_expiry(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    let least = 3 * crate::REFRESH;
    if d < least {
        return Err(format!(
            "{s:?} is shorter than three of an agent's refreshes of its candidate ({}s each): live candidates would be deleted; use at least {}m",
            crate::REFRESH.as_secs(),
            least.as_secs() / 60
        ));
    }
    Ok(d)
}

/// A lease duration: whole seconds (what a Lease's `leaseDurationSeconds` holds), at least 1 s,
/// so that what is written is exactly what the safety margin was checked against.
pub fn lease_duration(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d.subsec_nanos() != 0 || d.is_zero() {
        return Err(format!(
            "{s:?} is not a whole number of seconds: a Lease holds its duration in whole seconds (leaseDurationSeconds), use e.g. 3s"
        ));
    }
    if d.as_secs() > i32::MAX as u64 {
        return Err(format!("{s:?} is too long for leaseDurationSeconds"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_a_label_value() {
        assert_eq!(instance("team-a.blue_1"), Ok("team-a.blue_1".into()));
        for bad in ["", "-a", "a-", "a b", "a/b", &"x".repeat(64)] {
            assert!(instance(bad).is_err(), "{bad:?}");
        }
        assert!(instance(&"x".repeat(63)).is_ok());
    }

    #[test]
    fn lease_durations_are_whole_positive_seconds() {
        assert_eq!(lease_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(lease_duration("1m"), Ok(Duration::from_secs(60)));
        for bad in ["2500ms", "900ms", "0s", "1.5s", "soon", "100000000000s"] {
            assert!(lease_duration(bad).is_err(), "{bad} accepted");
        }
        assert!(positive_duration("0s").is_err());
        assert_eq!(positive_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(arbiter_api::lease::seconds(Duration::from_secs(10)), 10);
    }

    #[test]
    fn a_candidate_expiry_spans_three_refreshes_at_least() {
        assert_eq!(candidate_expiry("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(candidate_expiry("15m"), Ok(Duration::from_secs(900)));
        for bad in ["14m59s", "10m", "5m", "30s", "0s", "soon"] {
            assert!(candidate_expiry(bad).is_err(), "{bad} accepted");
        }
    }
}
