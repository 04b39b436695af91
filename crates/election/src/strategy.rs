//! Which strategy governs a lease when candidates disagree.
//!
//! The strategy declared by the candidates with the highest `binaryVersion` wins: newer
//! binaries know about newer strategies, and an upgrade switches strategy once the first new
//! binary arrives. Candidates at that top version that disagree are a conflict, reported and
//! never guessed at. Unlike upstream's list walk, the result does not depend on list order.

use std::collections::BTreeSet;

use super::Version;

/// The built-in strategy: lowest emulationVersion, then lowest binaryVersion, then oldest
/// candidate, then name.
pub const OLDEST_EMULATION_VERSION: &str = "OldestEmulationVersion";

/// The outcome of strategy resolution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// No candidate with a readable binaryVersion.
    NoCandidates,
    /// The strategy that governs the lease.
    Strategy(String),
    /// Candidates at the highest binaryVersion declare different strategies.
    Conflict {
        version: Version,
        /// The distinct strategies declared at that version, sorted.
        strategies: Vec<String>,
        /// The candidates at that version, sorted by name.
        candidates: Vec<String>,
    },
}

/// Resolves the strategy from `(candidate name, binary version, strategy)` triples.
/// Candidates whose binary version is unreadable do not take part.
pub fn resolve<'a, I>(candidates: I) -> Resolution
where
    I: IntoIterator<Item = (&'a str, Option<&'a Version>, &'a str)>,
{
    let mut top: Option<(&Version, Vec<(&str, &str)>)> = None;
    for (name, version, strategy) in candidates {
        let Some(version) = version else { continue };
        match &mut top {
            Some((v, members)) if *v == version => members.push((name, strategy)),
            Some((v, _)) if *v > version => {}
            _ => top = Some((version, vec![(name, strategy)])),
        }
    }
    let Some((version, members)) = top else {
        return Resolution::NoCandidates;
    };
    let strategies: BTreeSet<&str> = members.iter().map(|(_, s)| *s).collect();
    if strategies.len() == 1 {
        return Resolution::Strategy(members[0].1.to_string());
    }
    let mut names: Vec<String> = members.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    Resolution::Conflict {
        version: version.clone(),
        strategies: strategies.into_iter().map(str::to_string).collect(),
        candidates: names,
    }
}

#[cfg(test)]
mod tests {
    use super::OLDEST_EMULATION_VERSION as OEV;
    use super::*;

    fn run(cands: &[(&str, &str, &str)]) -> Resolution {
        let parsed: Vec<(&str, Option<Version>, &str)> = cands
            .iter()
            .map(|(n, v, s)| (*n, Version::parse(v).ok(), *s))
            .collect();
        resolve(parsed.iter().map(|(n, v, s)| (*n, v.as_ref(), *s)))
    }

    /// (case name, candidates as (name, binary version, strategy), the strategy or None for a conflict)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str, &'a str)], Option<&'a str>);

    fn strategy(s: &str) -> Resolution {
        Resolution::Strategy(s.into())
    }

    /// kep4355.md §6.1 `TestPickBestStrategy`, with every case also run reversed.
    #[test]
    fn upstream_pick_best_strategy_cases() {
        let cases: &[Case] = &[
            ("one candidate", &[("a", "1.31.0", OEV)], Some(OEV)),
            (
                "newer binary wins",
                &[("a", "1.32.0", OEV), ("b", "1.31.0", "foo.com/bar")],
                Some(OEV),
            ),
            (
                "semver not string",
                &[("a", "1.1.10", OEV), ("b", "1.1.2", "foo.com/bar")],
                Some(OEV),
            ),
            (
                "agreeing at top",
                &[("a", "1.31.0", OEV), ("b", "1.31.0", OEV)],
                Some(OEV),
            ),
            (
                "conflict at top",
                &[("a", "1.31.0", OEV), ("b", "1.31.0", "foo.com/bar")],
                None,
            ),
        ];
        for (name, cands, want) in cases {
            let mut reversed = cands.to_vec();
            reversed.reverse();
            for order in [cands.to_vec(), reversed] {
                let got = run(&order);
                match want {
                    Some(s) => assert_eq!(got, strategy(s), "{name}"),
                    None => assert!(
                        matches!(got, Resolution::Conflict { .. }),
                        "{name}: {got:?}"
                    ),
                }
            }
        }
    }

    /// Upstream's walk gives an error for [A, B, C] and X for [C, A, B]; we give X for both.
    #[test]
    fn order_dependent_upstream_case_is_resolved_by_the_top_version() {
        let abc = [
            ("a", "1.31.0", "x.com/x"),
            ("b", "1.31.0", "y.com/y"),
            ("c", "1.32.0", "x.com/x"),
        ];
        let cab = [abc[2], abc[0], abc[1]];
        assert_eq!(run(&abc), strategy("x.com/x"));
        assert_eq!(run(&cab), strategy("x.com/x"));
    }

    #[test]
    fn conflict_names_the_strategies_and_candidates() {
        let got = run(&[
            ("b", "1.31.0", "foo.com/bar"),
            ("a", "1.31.0", OEV),
            ("c", "1.30.0", OEV),
        ]);
        assert_eq!(
            got,
            Resolution::Conflict {
                version: Version::parse("1.31.0").unwrap(),
                strategies: vec![OEV.into(), "foo.com/bar".into()],
                candidates: vec!["a".into(), "b".into()],
            }
        );
    }

    #[test]
    fn unreadable_versions_do_not_take_part() {
        assert_eq!(run(&[]), Resolution::NoCandidates);
        assert_eq!(run(&[("a", "abc", OEV)]), Resolution::NoCandidates);
        assert_eq!(
            run(&[("a", "abc", "foo.com/bar"), ("b", "1.0.0", OEV)]),
            strategy(OEV)
        );
    }
}
