//! Work queues of lease keys: deduplicated, with delayed requeues, one per worker. A lease
//! always goes to the same worker (so it is never reconciled twice at once), chosen by the
//! ConfigMap shard its term marks live in (so no two workers contend for one shard).
//!
//! Namespaces with due keys take turns ([`turns`]: a burst in one namespace does not hold up
//! another's failover). Within a namespace, due keys are taken longest waiting first, and a
//! lease whose election is under way (pinged,
//! waiting for answers or for a term to run out) waits from the moment its election began
//! ([`Queue::electing`]), not from its latest event: the answers to its pings put it ahead of
//! every lease whose election began later. So under overload leases finish their elections in
//! the order they began them (rather than all advancing a step at a time while their answers
//! age), and no lease waits behind leases that became due after it: after a burst of
//! expiries, a lease's wait is the backlog ahead of it when it expired. (Taken lowest key
//! first, as they once were, elections finished too, but a lease whose name sorts late waited
//! behind every lease that expired after it: a burst's p99 was ten times its median.)

pub mod turns;

use std::collections::HashMap;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::mpsc;

use super::key::LeaseKey;
use tokio_util::time::{DelayQueue, delay_queue};
pub use turns::Fairness;
use turns::Turns;

/// The longest a lease waits for its next look. A lease's duration comes from records others
/// can write (a Lease's `leaseDurationSeconds`, a candidate's declared duration), up to 68
/// years; a look earlier than needed only decides again (and the timer wheel refuses delays
/// over about two years).
pub const LOOK_AT_LEAST_EVERY: Duration = Duration::from_secs(3600);

/// The sending side: anything that notices a change enqueues the affected lease.
#[derive(Clone)]
pub struct Enqueue(Vec<mpsc::UnboundedSender<(LeaseKey, tokio::time::Instant)>>);

impl Enqueue {
    pub fn key(&self, key: LeaseKey) {
        let worker = worker_of(&key, self.0.len());
        // The receiver lives as long as the worker; if it is gone the process is exiting.
        let _ = self.0[worker].send((key, tokio::time::Instant::now()));
    }
}

/// The worker (of `workers`) that reconciles `key`: by its namespace and term shard. A
/// namespace's shards are dealt round the workers from a point its name picks, so each worker
/// gets as many of them as any other, give or take one (a hash of namespace and shard left
/// some workers idle and gave others twice the mean).
pub fn worker_of(key: &LeaseKey, workers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.namespace.hash(&mut h);
    let start = h.finish() % crate::term::ledger::SHARDS;
    ((start + crate::term::ledger::shard_index(&key.name)) % workers.max(1) as u64) as usize
}

/// What the queues report: how long a due lease waits for its worker, and how many wait.
#[derive(Clone)]
pub struct QueueMetrics {
    pub wait: Histogram,
    pub depth: Gauge,
}

impl QueueMetrics {
    /// Metrics no registry reads (tests).
    #[cfg(test)]
    pub(crate) fn unregistered() -> QueueMetrics {
        QueueMetrics {
            wait: Histogram::new([1.0]),
            depth: Gauge::default(),
        }
    }
}

/// The receiving side, owned by the worker.
pub struct Queue {
    rx: mpsc::UnboundedReceiver<(LeaseKey, tokio::time::Instant)>,
    /// Due now, in the order they are taken: namespaces in turn, each by rank (when the key, or
    /// its election, began to wait), oldest first.
    ready: Turns,
    /// Each due key's place in `ready`, and when it became due.
    due: HashMap<LeaseKey, Due>,
    /// Leases whose election is under way, since when ([`Queue::electing`]).
    elections: HashMap<LeaseKey, tokio::time::Instant>,
    /// The key being reconciled, and since when it was due.
    current: Option<(LeaseKey, tokio::time::Instant)>,
    delayed: DelayQueue<LeaseKey>,
    delay_keys: HashMap<LeaseKey, delay_queue::Key>,
    metrics: QueueMetrics,
    /// When the worker first asked for a key: a replica that stood by before it led does not
    /// count its standby in the waits.
    working_since: Option<tokio::time::Instant>,
}

/// A due key: its rank in [`Queue::ready`], and when it became due (its wait, measured).
#[derive(Clone, Copy)]
struct Due {
    rank: tokio::time::Instant,
    since: tokio::time::Instant,
}

/// One queue per worker (at least one).
pub fn queues(workers: usize, fairness: Fairness, metrics: QueueMetrics) -> (Enqueue, Vec<Queue>) {
    let (senders, queues) = (0..workers.max(1))
        .map(|_| {
            let (tx, rx) = mpsc::unbounded_channel();
            let q = Queue {
                rx,
                ready: Turns::new(fairness),
                due: HashMap::new(),
                elections: HashMap::new(),
                current: None,
                delayed: DelayQueue::new(),
                delay_keys: HashMap::new(),
                metrics: metrics.clone(),
                working_since: None,
            };
            (tx, q)
        })
        .unzip();
    (Enqueue(senders), queues)
}

#[cfg(test)]
fn queue() -> (Enqueue, Queue) {
    let (tx, mut qs) = queues(1, Fairness::Namespaces, QueueMetrics::unregistered());
    (tx, qs.remove(0))
}

impl Queue {
    /// The next key to reconcile; `None` when every sender is gone.
    pub async fn next(&mut self) -> Option<LeaseKey> {
        self.working_since
            .get_or_insert_with(tokio::time::Instant::now);
        loop {
            // Drain whatever is already waiting so duplicates collapse.
            while let Ok((key, sent)) = self.rx.try_recv() {
                self.make_ready(key, sent);
            }
            // Timers that fired are due like any change (an expiry must not wait behind a
            // stream of watch events).
            while !self.delayed.is_empty()
                && let Some(Some(expired)) = self.delayed.next().now_or_never()
            {
                self.fired(expired);
            }
            if let Some(key) = self.ready.pop() {
                if let Some(k) = self.delay_keys.remove(&key) {
                    self.delayed.remove(&k);
                }
                let since = match self.due.remove(&key) {
                    Some(due) => due.since,
                    None => tokio::time::Instant::now(),
                };
                self.metrics.wait.observe(since.elapsed().as_secs_f64());
                self.metrics.depth.dec();
                self.current = Some((key.clone(), since));
                return Some(key);
            }
            tokio::select! {
                key = self.rx.recv() => {
                    let (key, sent) = key?;
                    self.make_ready(key, sent);
                }
                Some(expired) = self.delayed.next(), if !self.delayed.is_empty() => {
                    self.fired(expired);
                }
            }
        }
    }

    /// A timer that fired: its key is due since its deadline.
    fn fired(&mut self, expired: delay_queue::Expired<LeaseKey>) {
        let deadline = expired.deadline();
        let key = expired.into_inner();
        self.delay_keys.remove(&key);
        self.make_ready(key, deadline);
    }

    /// `key` is due since `since` (or since the worker started, if that is later).
    fn make_ready(&mut self, key: LeaseKey, since: tokio::time::Instant) {
        let since = self.working_since.map_or(since, |w| w.max(since));
        let rank = self
            .elections
            .get(&key)
            .map_or(since, |&began| began.min(since));
        match self.due.get_mut(&key) {
            Some(due) => {
                due.since = due.since.min(since);
                self.move_up(&key, rank);
            }
            None => {
                self.ready.insert(rank, key.clone());
                self.due.insert(key, Due { rank, since });
                self.metrics.depth.inc();
            }
        }
    }

    /// A due `key` ranks no later than `rank`.
    fn move_up(&mut self, key: &LeaseKey, rank: tokio::time::Instant) {
        if let Some(due) = self.due.get_mut(key)
            && due.rank > rank
        {
            self.ready.rerank(key, due.rank, rank);
            due.rank = rank;
        }
    }

    /// After reconciling `key`: whether its election is under way (it was pinged, waits for
    /// answers or for a term to run out). Until a reconcile says it no longer is, the lease
    /// ranks from when the reconcile that found it so became due.
    pub fn electing(&mut self, key: &LeaseKey, electing: bool) {
        if !electing {
            self.elections.remove(key);
            return;
        }
        let began = match &self.current {
            Some((k, since)) if k == key => *since,
            _ => tokio::time::Instant::now(),
        };
        let began = *self.elections.entry(key.clone()).or_insert(began);
        // Due again already (the watch's echo of its own writes): it moves up.
        self.move_up(key, began);
    }

    /// Reconcile `key` again after `after` (at most [`LOOK_AT_LEAST_EVERY`]), unless it is
    /// already due sooner.
    pub fn requeue(&mut self, key: LeaseKey, after: Duration) {
        let after = after.min(LOOK_AT_LEAST_EVERY);
        match self.delay_keys.get(&key) {
            Some(k) if self.delayed.deadline(k) <= tokio::time::Instant::now() + after => {}
            Some(k) => self.delayed.reset(k, after),
            None => {
                let k = self.delayed.insert(key.clone(), after);
                self.delay_keys.insert(key, k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The histogram as /metrics shows it, named `wait`.
    fn exposed(wait: &Histogram) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("wait", "", wait.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    fn key(n: &str) -> LeaseKey {
        LeaseKey {
            namespace: "ns".into(),
            name: n.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn duplicates_collapse_and_delays_fire() {
        let (tx, mut q) = queue();
        tx.key(key("a"));
        tx.key(key("a"));
        tx.key(key("b"));
        assert_eq!(q.next().await, Some(key("a")));
        assert_eq!(q.next().await, Some(key("b")));
        q.requeue(key("c"), Duration::from_secs(10));
        q.requeue(key("c"), Duration::from_secs(2)); // sooner wins
        q.requeue(key("c"), Duration::from_secs(30)); // later is ignored
        let start = tokio::time::Instant::now();
        assert_eq!(q.next().await, Some(key("c")));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // A key enqueued directly drops its pending delay.
        q.requeue(key("d"), Duration::from_secs(5));
        tx.key(key("d"));
        assert_eq!(q.next().await, Some(key("d")));
        drop(tx);
        assert_eq!(q.next().await, None);
    }

    /// A delay from a record others wrote (a lease duration of 68 years, a declared one
    /// longer still) is a look within the hour, not a panic of the timer wheel.
    #[tokio::test(start_paused = true)]
    async fn a_delay_of_years_is_a_look_within_the_hour() {
        let (_tx, mut q) = queue();
        q.requeue(key("a"), Duration::from_secs(i32::MAX as u64));
        q.requeue(key("b"), Duration::MAX);
        let start = tokio::time::Instant::now();
        assert_eq!(q.next().await, Some(key("a")));
        assert_eq!(q.next().await, Some(key("b")));
        assert_eq!(start.elapsed(), LOOK_AT_LEAST_EVERY);
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_waiting_comes_first_and_an_election_waits_from_its_start() {
        let second = || tokio::time::advance(Duration::from_secs(1));
        let (tx, mut q) = queue();
        // The worker is at work (it has been asking for keys).
        tx.key(key("0"));
        assert_eq!(q.next().await, Some(key("0")));
        tx.key(key("z"));
        second().await;
        tx.key(key("a"));
        assert_eq!(
            q.next().await,
            Some(key("z")),
            "due first, though it sorts last"
        );
        // z was pinged: its election began when it became due.
        q.electing(&key("z"), true);
        q.requeue(key("z"), Duration::from_secs(5));
        second().await;
        tx.key(key("b"));
        tx.key(key("z")); // the answer
        assert_eq!(
            q.next().await,
            Some(key("z")),
            "its election began before a and b were due"
        );
        q.electing(&key("z"), true); // still under way: from its start, not from now
        q.requeue(key("z"), Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(6)).await;
        tx.key(key("c"));
        assert_eq!(q.next().await, Some(key("z")), "its ack window ended");
        q.electing(&key("z"), false); // elected
        tx.key(key("z"));
        assert_eq!(q.next().await, Some(key("a")));
        assert_eq!(q.next().await, Some(key("b")));
        // c and z were sent at the same instant (c sorts first): z no longer ranks from its
        // election's start.
        assert_eq!(q.next().await, Some(key("c")));
        assert_eq!(
            q.next().await,
            Some(key("z")),
            "an elected lease waits from its event again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_namespaces_key_is_taken_between_a_bursts_keys() {
        let other = |ns: &str, n: &str| LeaseKey {
            namespace: ns.into(),
            name: n.into(),
        };
        let (tx, mut q) = queue();
        for i in 0..100 {
            tx.key(other("noisy", &format!("l{i:03}")));
        }
        assert_eq!(q.next().await, Some(other("noisy", "l000")));
        // A failover in another namespace (its timer fires) after the whole burst was due.
        q.requeue(other("quiet", "work"), Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(q.next().await, Some(other("noisy", "l001")), "noisy's turn");
        assert_eq!(
            q.next().await,
            Some(other("quiet", "work")),
            "then quiet's, not after the other 98"
        );
        // An election under way in the burst still ranks first within its namespace.
        assert_eq!(q.next().await, Some(other("noisy", "l002")));
        q.electing(&other("noisy", "l002"), true);
        tx.key(other("noisy", "l002"));
        assert_eq!(q.next().await, Some(other("noisy", "l002")));
    }

    #[tokio::test(start_paused = true)]
    async fn an_election_that_began_moves_up_a_key_already_due_again() {
        let (tx, mut q) = queue();
        tx.key(key("0"));
        assert_eq!(q.next().await, Some(key("0")));
        tx.key(key("y"));
        assert_eq!(q.next().await, Some(key("y")));
        // While y is reconciled: another lease's event, then the echo of y's own ping.
        tokio::time::advance(Duration::from_secs(1)).await;
        tx.key(key("c"));
        tokio::time::advance(Duration::from_secs(1)).await;
        tx.key(key("y"));
        q.electing(&key("y"), true);
        assert_eq!(q.next().await, Some(key("y")));
        q.electing(&key("y"), false);
        assert_eq!(q.next().await, Some(key("c")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fired_timer_does_not_wait_for_the_events_to_run_dry() {
        let (tx, mut q) = queue();
        q.requeue(key("a"), Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(2)).await;
        // Events keep coming for other leases: the expired lease is due among them.
        tx.key(key("b"));
        assert_eq!(q.next().await, Some(key("a")));
        tx.key(key("c"));
        assert_eq!(q.next().await, Some(key("b")));
        assert_eq!(q.next().await, Some(key("c")));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_of_due_leases_is_measured_and_their_number_kept() {
        let metrics = QueueMetrics {
            wait: Histogram::new([0.5, 2.5, 5.0]),
            depth: Gauge::default(),
        };
        let (tx, mut qs) = queues(1, Fairness::Namespaces, metrics.clone());
        let q = &mut qs[0];
        // The worker is at work (it has been asking for keys).
        tx.key(key("0"));
        assert_eq!(q.next().await, Some(key("0")));
        tx.key(key("a"));
        tx.key(key("a"));
        tx.key(key("b"));
        q.requeue(key("c"), Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(3)).await;
        // a and b waited 3 s; c became due after 1 s and waited 2 s.
        assert_eq!(q.next().await, Some(key("a")));
        assert_eq!(
            metrics.depth.get(),
            2,
            "b and c (its timer fired) still due"
        );
        assert_eq!(q.next().await, Some(key("b")));
        assert_eq!(q.next().await, Some(key("c")));
        assert_eq!(metrics.depth.get(), 0);
        let text = exposed(&metrics.wait);
        assert!(text.contains("wait_sum 8.0"), "{text}");
        assert!(text.contains("wait_count 4"), "{text}");
        assert!(text.contains("wait_bucket{le=\"2.5\"} 2"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_does_not_count_its_standby_as_waiting() {
        let metrics = QueueMetrics {
            wait: Histogram::new([1.0]),
            depth: Gauge::default(),
        };
        let (tx, mut qs) = queues(1, Fairness::Namespaces, metrics.clone());
        // The watches fill the queue while the replica stands by for an hour.
        tx.key(key("a"));
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(qs[0].next().await, Some(key("a")));
        let text = exposed(&metrics.wait);
        assert!(text.contains("wait_sum 0.0"), "{text}");
    }

    #[tokio::test]
    async fn a_lease_always_goes_to_one_worker_and_the_work_is_spread() {
        let (tx, mut qs) = queues(4, Fairness::Namespaces, QueueMetrics::unregistered());
        let keys: Vec<LeaseKey> = (0..200).map(|i| key(&format!("lease-{i}"))).collect();
        for k in &keys {
            tx.key(k.clone());
        }
        for k in &keys {
            let w = worker_of(k, 4);
            assert_eq!(w, worker_of(k, 4), "stable");
            // Leases that share a term shard share a worker.
            let twin = keys.iter().find(|o| {
                o.name != k.name
                    && crate::term::ledger::shard_of(&o.name)
                        == crate::term::ledger::shard_of(&k.name)
            });
            if let Some(t) = twin {
                assert_eq!(worker_of(t, 4), w);
            }
        }
        let mut per_worker = Vec::new();
        for q in qs.iter_mut() {
            let mut n = 0;
            while let Ok((k, _)) = q.rx.try_recv() {
                assert_eq!(worker_of(&k, 4), per_worker.len());
                n += 1;
            }
            per_worker.push(n);
        }
        assert_eq!(per_worker.iter().sum::<usize>(), 200);
        assert!(per_worker.iter().all(|&n| n > 20), "{per_worker:?}");
    }

    #[test]
    fn a_namespaces_term_shards_are_dealt_evenly_round_the_workers() {
        let shards = crate::term::ledger::SHARDS as usize;
        // One lease per shard, found by name.
        let mut by_shard: HashMap<u64, LeaseKey> = HashMap::new();
        for i in 0.. {
            let k = key(&format!("lease-{i}"));
            by_shard
                .entry(crate::term::ledger::shard_index(&k.name))
                .or_insert(k);
            if by_shard.len() == shards {
                break;
            }
        }
        for workers in [1, 3, 4, 16, 32, 63, 64] {
            let mut load = vec![0; workers];
            for k in by_shard.values() {
                load[worker_of(k, workers)] += 1;
            }
            let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
            assert!(max - min <= 1, "{workers} workers: {load:?}");
            assert_eq!(*min, shards / workers, "{workers} workers: {load:?}");
        }
    }
}
