//! What this worker wrote to candidates that its cache may not show yet: their statuses, and
//! the pings it sent.
//!
//! A lease is often reconciled again before the watch delivers what the last reconcile wrote
//! (the answers to a ping arrive while the other pings and the statuses are being written).
//! Judged from the cache alone, a status would be written again, with its transition's Event
//! (`Elected`, `Deposed`, ...) published again, and a candidate pinged again. So the worker
//! remembers, per candidate, the value it read and the one it wrote: while the cache still shows
//! the one it read, the one it wrote stands for it. Once the cache shows anything else (the
//! write, or someone else's), the cache counts again. A memory is kept at most [`KEPT_FOR`], so
//! a hand edit that puts back exactly the value read before is overlooked no longer than that.
//!
//! For pings this is also the stricter view: a newer ping time can only turn an acknowledgement
//! into one still awaited.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a written value stands for a cache that has not shown it yet.
pub const KEPT_FOR: Duration = Duration::from_secs(30);

struct Write<T> {
    read: T,
    wrote: T,
    at: Instant,
}

/// Per candidate (namespace, name): the value read and the value written.
pub struct Written<T> {
    writes: HashMap<(String, String), Write<T>>,
    prune_at: usize,
}

impl<T> Default for Written<T> {
    fn default() -> Self {
        Written {
            writes: HashMap::new(),
            prune_at: 0,
        }
    }
}

impl<T: Clone> Written<T> {
    /// The value this worker wrote, while `cached` is still what it read before writing it;
    /// `None` when the cache counts.
    pub fn current<Q>(
        &mut self,
        candidate: &(String, String),
        cached: &Q,
        now: Instant,
    ) -> Option<T>
    where
        T: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        let w = self.writes.get(candidate)?;
        if w.read.borrow() == cached && now.saturating_duration_since(w.at) < KEPT_FOR {
            return Some(w.wrote.clone());
        }
        self.writes.remove(candidate);
        None
    }

    /// Records that `wrote` was written over `read`.
    pub fn record(&mut self, candidate: (String, String), read: T, wrote: T, now: Instant) {
        self.writes.insert(
            candidate,
            Write {
                read,
                wrote,
                at: now,
            },
        );
        if self.writes.len() >= self.prune_at.max(64) {
            self.writes
                .retain(|_, w| now.saturating_duration_since(w.at) < KEPT_FOR);
            self.prune_at = 2 * self.writes.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn cond(status: &str) -> Vec<Condition> {
        vec![Condition {
            type_: "Leader".into(),
            status: status.into(),
            reason: "R".into(),
            message: "m".into(),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }]
    }

    fn key() -> (String, String) {
        ("ns".into(), "c".into())
    }

    #[test]
    fn a_write_stands_for_a_cache_that_has_not_shown_it() {
        let mut w = Written::default();
        let t0 = Instant::now();
        w.record(key(), cond("False"), cond("True"), t0);
        assert_eq!(
            w.current(&key(), &cond("False")[..], t0),
            Some(cond("True"))
        );
        // Shown: the cache counts again, and the memory goes.
        assert_eq!(w.current(&key(), &cond("True")[..], t0), None);
        assert!(w.writes.is_empty());
    }

    #[test]
    fn someone_elses_status_counts_at_once() {
        let mut w = Written::default();
        let t0 = Instant::now();
        w.record(key(), cond("False"), cond("True"), t0);
        assert_eq!(w.current(&key(), &cond("Unknown")[..], t0), None);
        // ... and the memory is gone even if the cache goes back to what was read.
        assert_eq!(w.current(&key(), &cond("False")[..], t0), None);
    }

    #[test]
    fn a_write_stands_no_longer_than_kept_for() {
        let mut w = Written::default();
        let t0 = Instant::now();
        w.record(key(), cond("False"), cond("True"), t0);
        assert_eq!(w.current(&key(), &cond("False")[..], t0 + KEPT_FOR), None);
    }

    #[test]
    fn old_memories_are_pruned() {
        let mut w: Written<Vec<Condition>> = Written::default();
        let t0 = Instant::now();
        for i in 0..63 {
            w.record(("ns".into(), format!("c{i}")), vec![], cond("True"), t0);
        }
        w.record(key(), vec![], cond("True"), t0 + KEPT_FOR);
        assert_eq!(w.writes.len(), 1);
    }
}
