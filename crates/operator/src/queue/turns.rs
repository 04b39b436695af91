//! The due keys of one worker's queue, in the order they are taken: namespaces with due keys
//! take turns (round-robin, one key each), and within a namespace the key that has waited
//! longest comes first. A burst of elections in one namespace then delays another namespace's
//! failover by at most one reconcile per namespace with due work on the same worker, not by
//! the whole burst. With [`Fairness::None`] every key waits in one line, longest waiting first,
//! whatever its namespace (the order before; kept to compare against in `make bench`).

use std::collections::{BTreeSet, HashMap, VecDeque};

use tokio::time::Instant;

use crate::key::LeaseKey;

/// How due leases share a worker (`--queue-fairness`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Fairness {
    /// Namespaces with due leases take turns; within one, the longest waiting first.
    #[default]
    Namespaces,
    /// The longest waiting first, whatever its namespace: one namespace's burst delays every
    /// other namespace's elections (for comparison).
    None,
}

/// Due keys by rank (when they, or their election, began to wait), in turns of their lines.
#[derive(Debug, Default)]
pub struct Turns {
    fairness: Fairness,
    /// Each line's due keys, oldest rank first: a line per namespace, or one for all.
    lines: HashMap<String, BTreeSet<(Instant, LeaseKey)>>,
    /// The lines with due keys, the next to serve first.
    turns: VecDeque<String>,
}

impl Turns {
    pub fn new(fairness: Fairness) -> Turns {
        Turns {
            fairness,
            ..Turns::default()
        }
    }

    fn line(&self, key: &LeaseKey) -> String {
        match self.fairness {
            Fairness::Namespaces => key.namespace.to_string(),
            Fairness::None => String::new(),
        }
    }

    /// `key`, not due yet, is due with `rank`: its line joins the turns at the end if it had
    /// nothing due.
    pub fn insert(&mut self, rank: Instant, key: LeaseKey) {
        let line = self.line(&key);
        let keys = self.lines.entry(line.clone()).or_default();
        if keys.is_empty() {
            self.turns.push_back(line);
        }
        keys.insert((rank, key));
    }

    /// A due `key` now ranks `to` instead of `from`; its line keeps its turn.
    pub fn rerank(&mut self, key: &LeaseKey, from: Instant, to: Instant) {
        if let Some(keys) = self.lines.get_mut(&self.line(key))
            && keys.remove(&(from, key.clone()))
        {
            keys.insert((to, key.clone()));
        }
    }

    /// The next key: the oldest of the line whose turn it is; that line goes to the end of the
    /// turns if it has more.
    pub fn pop(&mut self) -> Option<LeaseKey> {
        let line = self.turns.pop_front()?;
        let keys = self.lines.get_mut(&line)?;
        let (_, key) = keys.pop_first()?;
        if keys.is_empty() {
            self.lines.remove(&line);
        } else {
            self.turns.push_back(line);
        }
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(ns: &str, n: &str) -> LeaseKey {
        LeaseKey {
            namespace: ns.into(),
            name: n.into(),
        }
    }

    fn drain(t: &mut Turns) -> Vec<LeaseKey> {
        std::iter::from_fn(|| t.pop()).collect()
    }

    #[test]
    fn namespaces_take_turns_and_each_serves_its_oldest_first() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut t = Turns::new(Fairness::Namespaces);
        // A burst in "noisy", then one key in each of two quiet namespaces.
        for i in 0..5 {
            t.insert(at(i), key("noisy", &format!("l{i}")));
        }
        t.insert(at(10), key("b", "x"));
        t.insert(at(11), key("c", "y"));
        assert_eq!(
            drain(&mut t),
            [
                key("noisy", "l0"),
                key("b", "x"),
                key("c", "y"),
                key("noisy", "l1"),
                key("noisy", "l2"),
                key("noisy", "l3"),
                key("noisy", "l4"),
            ]
        );
        // Without fairness: the longest waiting first, whatever the namespace.
        let mut t = Turns::new(Fairness::None);
        for i in 0..3 {
            t.insert(at(i), key("noisy", &format!("l{i}")));
        }
        t.insert(at(10), key("b", "x"));
        assert_eq!(drain(&mut t).last(), Some(&key("b", "x")));
    }

    #[test]
    fn a_namespace_that_runs_dry_joins_at_the_end_when_due_again() {
        let t0 = Instant::now();
        let mut t = Turns::new(Fairness::Namespaces);
        t.insert(t0, key("a", "1"));
        t.insert(t0, key("b", "1"));
        assert_eq!(t.pop(), Some(key("a", "1")));
        // a had nothing left; due again, it waits behind b.
        t.insert(t0, key("a", "2"));
        t.insert(t0, key("c", "1"));
        assert_eq!(drain(&mut t), [key("b", "1"), key("a", "2"), key("c", "1")]);
        assert_eq!(t.pop(), None);
        assert!(t.lines.is_empty() && t.turns.is_empty(), "nothing kept");
    }

    #[test]
    fn a_key_moved_up_keeps_its_namespaces_turn() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut t = Turns::new(Fairness::Namespaces);
        t.insert(at(5), key("a", "late"));
        t.insert(at(6), key("b", "1"));
        t.insert(at(3), key("a", "early"));
        // a's only other key ranks first now; a is still first in turn.
        t.rerank(&key("a", "late"), at(5), at(1));
        assert_eq!(
            drain(&mut t),
            [key("a", "late"), key("b", "1"), key("a", "early")]
        );
        // A key not due is not moved in.
        t.rerank(&key("a", "gone"), at(5), at(1));
        assert_eq!(t.pop(), None);
    }
}
