//! Versions as candidates declare them: semantic versions compared by precedence.
//!
//! The schema only admits strict `MAJOR.MINOR.PATCH[-PRE][+BUILD]`; on read we also tolerate a
//! leading `v` (image tags such as `v1.31.0` feed the same parser). Ordering is numeric
//! (`1.2.0 < 1.19.0`), a pre-release sorts below its release, and build metadata is ignored.

use std::cmp::Ordering;
use std::fmt;

/// A parsed version. Equality and ordering are semver precedence (build metadata ignored).
#[derive(Clone, Debug)]
pub struct Version(semver::Version);

/// A version string that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid version {input:?}: {reason}")]
pub struct VersionError {
    pub input: String,
    pub reason: String,
}

impl Version {
    /// Parses `1.31.0`, `v1.31.0`, `1.32.0-rc.1`; refuses `1.30`, `1.30.1.6`, `abc`.
    pub fn parse(input: &str) -> Result<Version, VersionError> {
        let trimmed = input.strip_prefix('v').unwrap_or(input);
        semver::Version::parse(trimmed)
            .map(Version)
            .map_err(|e| VersionError {
                input: input.to_string(),
                reason: e.to_string(),
            })
    }

    pub fn major(&self) -> u64 {
        self.0.major
    }

    pub fn minor(&self) -> u64 {
        self.0.minor
    }

    /// How many minor versions apart two versions are (across majors, counted as unknown:
    /// `None`, which callers treat as "too far").
    pub fn minor_distance(&self, other: &Version) -> Option<u64> {
        (self.0.major == other.0.major).then(|| self.0.minor.abs_diff(other.0.minor))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.cmp_precedence(&other.0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn parses_strict_semver_and_tolerates_leading_v() {
        assert_eq!(v("1.31.0").to_string(), "1.31.0");
        assert_eq!(v("v1.31.0"), v("1.31.0"));
        assert_eq!(v("0.1.0").to_string(), "0.1.0");
        assert_eq!(v("0.3.0").to_string(), "0.3.0");
    }

    #[test]
    fn refuses_malformed_versions() {
        for bad in [
            "", "abc", "1.30", "1.30.1.6", "xyz", "invalid", "V1.2.3", "1.2.3 ",
        ] {
            let err = Version::parse(bad).expect_err(bad);
            assert_eq!(err.input, bad);
        }
    }

    #[test]
    fn orders_numerically_with_prereleases_below_releases() {
        assert!(v("1.2.0") < v("1.19.0"));
        assert!(v("1.1.2") < v("1.1.10"));
        assert!(v("1.19.0") < v("1.20.0"));
        assert!(v("1.31.0-rc.1") < v("1.31.0"));
        assert!(v("1.31.0-alpha.2") < v("1.31.0-beta.1"));
        assert!(v("1.30.9") < v("1.31.0-alpha.0"));
        assert_eq!(v("1.31.0+build.1"), v("1.31.0+build.2"));
    }

    #[test]
    fn minor_distance_within_a_major_only() {
        assert_eq!(v("1.30.0").minor_distance(&v("1.33.2")), Some(3));
        assert_eq!(v("1.33.0").minor_distance(&v("1.30.2")), Some(3));
        assert_eq!(v("1.30.0").minor_distance(&v("2.30.0")), None);
    }
}
