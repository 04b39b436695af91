//! The OldestEmulationVersion strategy: who should lead among eligible candidates.
//!
//! The best candidate has the lowest emulationVersion, then the lowest binaryVersion, then the
//! oldest creationTimestamp, then the lowest name. The name makes the order total, so the
//! result never depends on the order candidates are listed in (upstream keeps whichever equal
//! candidate came first in its cache).

use std::cmp::Ordering;

use jiff::Timestamp;

use super::Version;

/// What the ordering needs to know about a candidate whose versions parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranked<'a> {
    pub name: &'a str,
    pub emulation: &'a Version,
    pub binary: &'a Version,
    pub created: Timestamp,
}

/// `Less` when `a` should lead rather than `b`.
pub fn compare(a: &Ranked<'_>, b: &Ranked<'_>) -> Ordering {
    a.emulation
        .cmp(b.emulation)
        .then_with(|| a.binary.cmp(b.binary))
        .then_with(|| a.created.cmp(&b.created))
        .then_with(|| a.name.cmp(b.name))
}

/// Like [`compare`], but among candidates at the same versions `preferred` (a handover's
/// target) comes first.
pub fn compare_preferring(a: &Ranked<'_>, b: &Ranked<'_>, preferred: Option<&str>) -> Ordering {
    let not_preferred = |r: &Ranked<'_>| Some(r.name) != preferred;
    (a.emulation, a.binary)
        .cmp(&(b.emulation, b.binary))
        .then_with(|| not_preferred(a).cmp(&not_preferred(b)))
        .then_with(|| compare(a, b))
}

/// The best of `candidates`, if any.
pub fn pick_best<'a, 'b>(
    candidates: impl IntoIterator<Item = &'b Ranked<'a>>,
) -> Option<&'b Ranked<'a>>
where
    'a: 'b,
{
    candidates.into_iter().min_by(|a, b| compare(a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;

    struct C {
        name: &'static str,
        emulation: Version,
        binary: Version,
        created: Timestamp,
    }

    fn c(name: &'static str, emulation: &str, binary: &str, created: Timestamp) -> C {
        C {
            name,
            emulation: Version::parse(emulation).unwrap(),
            binary: Version::parse(binary).unwrap(),
            created,
        }
    }

    fn ranked(cs: &[C]) -> Vec<Ranked<'_>> {
        cs.iter()
            .map(|c| Ranked {
                name: c.name,
                emulation: &c.emulation,
                binary: &c.binary,
                created: c.created,
            })
            .collect()
    }

    fn best(cs: &[C]) -> Option<&'static str> {
        let r = ranked(cs);
        pick_best(&r).map(|r| cs.iter().find(|c| c.name == r.name).unwrap().name)
    }

    /// kep4355.md §6.1 `TestPickBestLeaderOldestEmulationVersion`.
    #[test]
    fn upstream_pick_best_cases() {
        let now = Timestamp::now();
        let hour_ago = now - SignedDuration::from_hours(1);
        assert_eq!(best(&[]), None);
        assert_eq!(best(&[c("c1", "0.1.0", "0.1.0", now)]), Some("c1"));
        // different emulation
        assert_eq!(
            best(&[
                c("c1", "0.1.0", "0.1.0", hour_ago),
                c("c2", "0.2.0", "0.2.0", now)
            ]),
            Some("c1")
        );
        // same emulation, different binary
        assert_eq!(
            best(&[
                c("c1", "0.1.0", "0.1.0", hour_ago),
                c("c2", "0.1.0", "0.2.0", now)
            ]),
            Some("c1")
        );
        // same versions, different creation time
        assert_eq!(
            best(&[
                c("c2", "0.1.0", "0.1.0", now),
                c("c1", "0.1.0", "0.1.0", hour_ago)
            ]),
            Some("c1")
        );
    }

    /// kep4355.md §6.1 `TestCompare` (for the cases with readable versions; unreadable ones
    /// are not ranked at all).
    #[test]
    fn upstream_compare_cases() {
        let t = Timestamp::now();
        let cases = [
            // identical versions, lhs created 1 ns later: rhs leads
            (
                c("l", "1.20.0", "1.21.0", t + SignedDuration::from_nanos(1)),
                c("r", "1.20.0", "1.21.0", t),
                Ordering::Greater,
            ),
            (
                c("l", "1.19.0", "1.20.0", t),
                c("r", "1.20.0", "1.20.0", t),
                Ordering::Less,
            ),
            (
                c("l", "1.20.0", "1.20.0", t),
                c("r", "1.19.0", "1.20.0", t),
                Ordering::Greater,
            ),
            // numeric, not lexicographic
            (
                c("l", "1.2.0", "1.20.0", t),
                c("r", "1.19.0", "1.20.0", t),
                Ordering::Less,
            ),
        ];
        for (l, r, want) in cases {
            let pair = [l, r];
            let rk = ranked(&pair);
            assert_eq!(
                compare(&rk[0], &rk[1]),
                want,
                "{} vs {}",
                pair[0].emulation,
                pair[1].emulation
            );
            assert_eq!(compare(&rk[1], &rk[0]), want.reverse());
        }
    }

    /// kep4355.md §6.7 `TestMultipleLeaseCandidate`: binary/emulation 1.20/1.20, 1.20/1.19,
    /// 1.19/1.19, 1.20/1.19 elect the 1.19/1.19 candidate.
    #[test]
    fn upstream_multiple_candidates_case() {
        let t = Timestamp::now();
        let cs = [
            c("baz1", "1.20.0", "1.20.0", t),
            c("baz2", "1.19.0", "1.20.0", t),
            c("baz3", "1.19.0", "1.19.0", t),
            c("baz4", "1.19.0", "1.20.0", t),
        ];
        assert_eq!(best(&cs), Some("baz3"));
    }

    #[test]
    fn the_preferred_goes_first_among_equals_only() {
        let t = Timestamp::now();
        let cs = [
            c("a", "1.0.0", "1.0.0", t),
            c("b", "1.0.0", "1.0.0", t),
            c("old", "0.9.0", "1.0.0", t),
        ];
        let r = ranked(&cs);
        assert_eq!(
            compare_preferring(&r[0], &r[1], Some("b")),
            Ordering::Greater
        );
        assert_eq!(compare_preferring(&r[1], &r[0], Some("b")), Ordering::Less);
        assert_eq!(compare_preferring(&r[0], &r[1], None), Ordering::Less);
        // A lower version still leads.
        assert_eq!(compare_preferring(&r[2], &r[1], Some("b")), Ordering::Less);
    }

    #[test]
    fn name_breaks_full_ties() {
        let t = Timestamp::now();
        assert_eq!(
            best(&[c("b", "1.0.0", "1.0.0", t), c("a", "1.0.0", "1.0.0", t)]),
            Some("a")
        );
    }
}
